"""Tests for queuectl: helpers first, then one section per section of queuectl.py, in its order.

Run with `python3 -m pytest -q test_queuectl.py`. The end-to-end tests start real worker processes;
every wait polls with a deadline, so they stay deterministic on a slow, noisy machine.
"""

import contextlib
import io
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import queuectl  # noqa: E402  (imported from this test file's folder)

QUEUECTL = os.path.join(HERE, "queuectl.py")

# ==== Helpers ======================================================================================

STATES = ("pending", "processing", "completed", "failed", "dead")
CONFIG_KEYS = ("max-retries", "backoff-base", "backoff-max", "stale-timeout", "job-timeout", "retention")
CONFIG_DEFAULTS = {"max-retries": 3, "backoff-base": 2, "backoff-max": 3600,
                   "stale-timeout": 10, "job-timeout": 0, "retention": 604800}
JOB_KEYS = {"id", "command", "state", "attempts", "max_retries", "timeout", "cwd", "env",
            "created_at", "updated_at", "next_run_at", "last_error", "exit_code", "worker_id",
            "run_count"}
ERROR_PREFIX = "queuectl: error: "
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
TAG_VAR = "QUEUECTL_TEST_TAG"  # marks every process a test starts, so teardown can find them all
WAIT_S = 60.0

# A job that marks that it started, records its shell's pid, then waits for a `release` file
# (for at most ~60 s, so nothing can outlive a broken test for long).
BLOCKING_JOB = ('echo $$ > sh.pid; touch started; i=0; '
                'while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; '
                'echo finished')


@pytest.fixture
def db(tmp_path, monkeypatch):
    """Path of a fresh database in a temp folder; $QUEUECTL_DB cleared so it cannot interfere."""
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    return str(tmp_path / "queue.db")


def run_main(argv, stdin=None):
    """Call queuectl.main(argv) in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = queuectl.main(list(argv))
    finally:
        sys.stdin = saved_stdin
    return code, out.getvalue(), err.getvalue()


def cli(db, *args, stdin=None):
    """`queuectl --db DB ARGS...` in-process; return (exit code, stdout, stderr)."""
    return run_main(["--db", db, *args], stdin=stdin)


def ok(db, *args):
    """Run a command that must succeed; return its stdout."""
    code, out, err = cli(db, *args)
    assert code == 0, f"{args!r} -> exit {code}\nstdout: {out!r}\nstderr: {err!r}"
    assert "Traceback" not in err
    return out


def assert_one_error(err, *fragments):
    """stderr is exactly one `queuectl: error: ...` line that mentions every fragment."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith(ERROR_PREFIX), err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not named in {lines[0]!r}"


def assert_argparse_error(code, err):
    """An argparse-level error: exit 2 and a `queuectl: error:` line (usage lines may precede)."""
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    assert any(line.startswith(ERROR_PREFIX) for line in err.splitlines()), err


def enqueue(db, **fields):
    """Enqueue a job from keyword fields; return the job object printed by --json."""
    return json.loads(ok(db, "enqueue", json.dumps(fields), "--json"))


def get_job(db, job_id):
    """The job object from `show ID --json` (retrying while the db is reported busy)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        code, out, err = cli(db, "show", job_id, "--json")
        if code == 0:
            return json.loads(out)
        assert code == 1 and "busy" in err and time.monotonic() < deadline, (code, out, err)
        time.sleep(0.05)


def list_ids(db, *args):
    """Ids from `list ARGS --json`, in printed order."""
    return [job["id"] for job in json.loads(ok(db, "list", *args, "--json"))]


def snapshot(db):
    """Everything the CLI can see of the db; compared before/after a rejected request."""
    return ok(db, "list", "--json"), ok(db, "config", "list", "--json")


def parse_iso(text):
    """An ISO-8601 UTC `...Z` timestamp as an aware datetime."""
    assert ISO_UTC.match(text), text
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=timezone.utc)


def wait_for(predicate, what, timeout=WAIT_S, interval=0.05):
    """Poll predicate until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def pid_gone(pid):
    """True if pid no longer runs; a zombie counts as gone (PID 1 here does not reap)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X")


def child_env(**extra):
    """The environment for a queuectl child process, without $QUEUECTL_DB."""
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_DB"}
    env.update(extra)
    return env


def script(db, *args, timeout=WAIT_S):
    """Run the real script `python3 queuectl.py --db DB ARGS...`; return the CompletedProcess."""
    return subprocess.run([sys.executable, QUEUECTL, "--db", db, *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, env=child_env())


def tagged_pids(tag):
    """Pids of live processes whose environment carries TAG_VAR=tag (workers and their jobs)."""
    marker = f"{TAG_VAR}={tag}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if marker in environ and not pid_gone(int(name)):
            pids.append(int(name))
    return pids


class WorkerProc:
    """A real `queuectl worker start` process whose stderr goes to a file."""

    def __init__(self, popen, log_path):
        self.popen, self.log_path = popen, log_path

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_log(self, fragment, timeout=WAIT_S):
        """Wait until the worker's stderr contains fragment (fails early if the worker exits)."""
        def seen():
            if fragment in self.log():
                return True
            assert self.popen.poll() is None or fragment in self.log(), \
                f"worker exited {self.popen.returncode} before logging {fragment!r}:\n{self.log()}"
            return False
        wait_for(seen, f"{fragment!r} in worker log", timeout)

    def signal(self, sig):
        os.kill(self.popen.pid, sig)

    def wait(self, timeout=WAIT_S):
        """Wait for the worker to exit; return its exit code."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s:\n{self.log()}") from None


class Workers:
    """Starts worker processes for one test and kills whatever is left of them (and their jobs)."""

    def __init__(self, db, folder):
        self.db, self.folder, self.tag, self.procs = db, folder, uuid.uuid4().hex, []

    def start(self, *args):
        n = len(self.procs)
        log_path = self.folder / f"worker{n}.stderr"
        with open(log_path, "wb") as err, open(self.folder / f"worker{n}.stdout", "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, QUEUECTL, "--db", self.db, "worker", "start", *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                env=child_env(**{TAG_VAR: self.tag}))
        self.procs.append(WorkerProc(popen, log_path))
        return self.procs[-1]

    def cleanup(self):
        """SIGKILL every live process carrying this test's tag, then reap the workers."""
        for _ in range(50):
            pids = tagged_pids(self.tag)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait()


@pytest.fixture
def workers(db, tmp_path):
    """Factory for worker processes on `db`; everything they started is killed at teardown."""
    pool = Workers(db, tmp_path)
    try:
        yield pool
    finally:
        pool.cleanup()


@pytest.fixture
def seeded_db(db):
    """A db with one job and one non-default config value, so 'unchanged' means something."""
    enqueue(db, id="keep", command="echo keep", env={"K": "v"})
    ok(db, "config", "set", "max-retries", "4")
    return db


@pytest.fixture
def ran_db(db, workers, tmp_path):
    """A db after a burst worker ran: ok1 completed, bad1 dead; then p1 enqueued (pending)."""
    enqueue(db, id="ok1", command="echo hi", cwd=str(tmp_path))
    enqueue(db, id="bad1", command="echo oops; exit 4", max_retries=0, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    enqueue(db, id="p1", command="true")
    return db


# ==== Constants and config validators =============================================================

T0 = 1_800_000_000.0  # a fixed "now" for unit tests

@pytest.mark.parametrize("key,text,expected", [
    ("max_retries", "0", 0), ("max_retries", "5", 5), ("backoff_base", "1", 1.0), ("backoff_base", "2.5", 2.5),
    ("backoff_max", "0", 0.0), ("stale_timeout", "0.5", 0.5), ("job_timeout", "30", 30.0)])
def test_config_validators_accept(key, text, expected):
    assert queuectl.CONFIG[key][1](text) == expected


@pytest.mark.parametrize("key,text", [
    ("max_retries", "-1"), ("max_retries", "1.5"), ("max_retries", "x"), ("backoff_base", "0.99"),
    ("backoff_base", "nan"), ("backoff_max", "-1"), ("backoff_max", "inf"), ("stale_timeout", "0"),
    ("job_timeout", "-0.1"), ("max_retries", "9" * 5000)])
def test_config_validators_reject(key, text):
    with pytest.raises(queuectl.UsageError):
        queuectl.CONFIG[key][1](text)


# ==== Model ====

def test_iso_is_utc_with_z():
    assert queuectl.iso(0) == "1970-01-01T00:00:00.000Z"
    assert queuectl.iso(None) is None


# ==== Storage ====

def spec(job_id="j1", command="true", **kw):
    base = {"id": job_id, "command": command, "max_retries": 3, "timeout": 0.0, "cwd": "/", "env": {},
            "priority": 0, "queue": "default", "run_at": None, "depends_on": []}
    base.update(kw)
    return base


@pytest.fixture
def store(tmp_path):
    s = queuectl.Store(str(tmp_path / "q.db"))
    yield s
    s.close()


def register(store, worker_id="w1", now=T0):
    identity = {"host": "h", "pid": 1, "proc_start": "1", "boot_id": "b", "pid_ns": "ns"}
    store.register(worker_id, identity, 1, now)


def test_new_database_is_0600_wal_and_versioned(tmp_path):
    path = tmp_path / "new.db"
    s = queuectl.Store(str(path))
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert s.read("PRAGMA journal_mode")[0][0] == "wal"
        assert s.read("PRAGMA user_version")[0][0] == queuectl.SCHEMA_VERSION
        assert s.read("PRAGMA application_id")[0][0] == queuectl.APPLICATION_ID
    finally:
        s.close()


def test_concurrent_first_opens_do_not_race(tmp_path):
    path = str(tmp_path / "race.db")
    errors = []

    def opener():
        try:
            queuectl.Store(path).close()
        except Exception as e:  # noqa: BLE001 - any failure is the bug under test
            errors.append(e)
    threads = [threading.Thread(target=opener) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = queuectl.Store(path)
    assert s.read("PRAGMA user_version")[0][0] == queuectl.SCHEMA_VERSION
    s.close()


def test_opening_another_store_keeps_this_process_locks(tmp_path):
    # Regression: closing any descriptor of an SQLite file drops the process's POSIX locks, so
    # opening a second Store while the first holds the write lock must not release that lock.
    path = str(tmp_path / "locks.db")
    holder = queuectl.Store(path)
    holder.conn.execute("BEGIN IMMEDIATE")
    queuectl.Store(path).close()
    probe = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=0); c.execute('BEGIN IMMEDIATE')"
    result = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True)
    holder.conn.execute("ROLLBACK")
    holder.close()
    assert result.returncode != 0 and "locked" in result.stderr


def test_timeout_also_kills_children_that_left_the_group(tmp_path):
    marker = tmp_path / "escaped.pid"
    out = run(f"setsid sleep 300 & echo $! > {marker}; wait", timeout=0.5)
    assert "timed out" in out.error
    wait_for(lambda: marker.exists() and marker.read_text().strip(), "the setsid child's pid")
    escaped = int(marker.read_text())
    wait_for(lambda: queuectl.proc_start_time(escaped) is None, "the setsid child to be killed")


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "future.db"
    queuectl.Store(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {queuectl.SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(queuectl.BadDatabase, match="newer"):
        queuectl.Store(str(path))
    assert path.read_bytes() == before


def test_enqueue_get_and_duplicate(store):
    assert store.enqueue([spec()], T0) == ["j1"]
    job = store.get("j1")
    assert (job.state, job.attempts, job.next_run_at, job.created_at) == ("pending", 0, T0, T0)
    with pytest.raises(queuectl.Conflict):
        store.enqueue([spec(command="false")], T0 + 1)
    assert store.get("j1").command == "true"
    with pytest.raises(queuectl.NotFound):
        store.get("nope")


def test_list_jobs_limit_keeps_newest_oldest_first(store):
    for i in range(5):
        store.enqueue([spec(f"j{i}")], T0 + i)
    assert [j.id for j in store.list_jobs()] == ["j0", "j1", "j2", "j3", "j4"]
    assert [j.id for j in store.list_jobs(limit=2)] == ["j3", "j4"]
    assert store.list_jobs("dead") == []


def test_claim_is_exclusive_and_in_due_order(store):
    register(store)
    store.enqueue([spec("late")], T0 + 10)  # due later
    store.enqueue([spec("a")], T0)
    store.enqueue([spec("b")], T0)
    first = store.claim("w1", T0 + 1)
    second = store.claim("w1", T0 + 1)
    assert (first.id, second.id) == ("a", "b")
    assert store.claim("w1", T0 + 1) is None  # "late" is not due yet
    assert store.claim("w1", T0 + 10).id == "late"
    assert first.state == "processing" and first.run_count == 1


def test_claim_without_returning_fallback(store, monkeypatch):
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)
    register(store)
    store.enqueue([spec("a")], T0)
    job = store.claim("w1", T0)
    assert (job.id, job.state, job.worker_id) == ("a", "processing", "w1")
    assert store.claim("w1", T0) is None


def test_unregistered_worker_cannot_claim(store):
    store.enqueue([spec("a")], T0)
    assert store.claim("ghost", T0) is None
    assert store.get("a").state == "pending"


def test_claim_from_many_threads_never_duplicates(tmp_path):
    path = str(tmp_path / "many.db")
    s = queuectl.Store(path)
    register(s)
    for i in range(200):
        s.enqueue([spec(f"j{i}")], T0)
    claimed, lock = [], threading.Lock()

    def grab():
        mine = queuectl.Store(path, durable=False, busy_deadline_s=30)
        while (job := mine.claim("w1", T0)) is not None:
            with lock:
                claimed.append(job.id)
        mine.close()
    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(f"j{i}" for i in range(200))
    s.close()


def outcome(code=0, error=None, output="out"):
    return queuectl.Outcome(code, error, output, 0.01)


LOST = queuectl.Outcome(None, "worker lost", None, 0.0, interrupted="worker lost")


SETTINGS = {"backoff_base": 2, "backoff_max": 3600}


def test_finish_success_records_run(store):
    register(store)
    store.enqueue([spec()], T0)
    job = store.claim("w1", T0)
    after = store.finish(job, "w1", outcome(), SETTINGS, T0 + 1)
    assert (after.state, after.exit_code, after.worker_id) == ("completed", 0, None)
    assert store.run_output("j1")[1] == b"out"


def test_failures_back_off_then_die(store):
    register(store)
    store.enqueue([spec(max_retries=3)], T0)
    now, delays = T0, []
    for _ in range(3):
        job = store.claim("w1", now)
        after = store.finish(job, "w1", outcome(1, "exit code 1"), SETTINGS, now)
        delays.append(after.next_run_at - now)
        now = after.next_run_at
    assert after.state == "dead" and after.attempts == 3 and after.last_error == "exit code 1"
    assert delays[:2] == [2, 4]


def test_finish_by_a_worker_that_lost_the_job_writes_nothing(store):
    register(store, "w1")
    register(store, "w2")
    store.enqueue([spec()], T0)
    job = store.claim("w1", T0)
    assert store.interrupt(job, "w1", LOST, True, T0 + 1) == "pending"
    again = store.claim("w2", T0 + 1)
    assert store.finish(job, "w1", outcome(1, "boom"), SETTINGS, T0 + 2) is None
    assert store.interrupt(job, "w1", LOST, False, T0 + 2) is None
    current = store.get("j1")
    assert (current.state, current.worker_id, current.attempts) == ("processing", "w2", 0)
    assert store.finish(again, "w2", outcome(), SETTINGS, T0 + 3).state == "completed"


def test_recovery_is_not_an_attempt_but_is_capped(store):
    register(store)
    store.enqueue([spec()], T0)
    for _ in range(queuectl.LOST_WORKER_CAP):
        job = store.claim("w1", T0)
        state = store.interrupt(job, "w1", LOST, True, T0)
    job = store.get("j1")
    assert state == "dead" and job.attempts == 0 and job.lost_count == queuectl.LOST_WORKER_CAP
    assert "worker lost 3 times" in job.last_error


def test_release_puts_back_pending_without_attempt(store):
    register(store)
    store.enqueue([spec()], T0)
    job = store.claim("w1", T0)
    assert store.interrupt(job, "w1", queuectl.Outcome(None, "stop", b"", 0, "stop"), False, T0 + 5) == "pending"
    after = store.get("j1")
    assert (after.state, after.attempts, after.next_run_at) == ("pending", 0, T0 + 5)


def test_retry_dead_is_all_or_nothing(store):
    register(store)
    store.enqueue([spec("d", max_retries=0)], T0)
    store.enqueue([spec("p")], T0 + 1)
    store.finish(store.claim("w1", T0), "w1", outcome(1, "x"), SETTINGS, T0)
    with pytest.raises(queuectl.Conflict):
        store.retry_dead(["d", "p"], T0 + 2)
    assert store.get("d").state == "dead"
    with pytest.raises(queuectl.NotFound):
        store.retry_dead(["d", "missing"], T0 + 2)
    store.retry_dead(["d"], T0 + 3)
    revived = store.get("d")
    assert (revived.state, revived.attempts, revived.next_run_at) == ("pending", 0, T0 + 3)


def test_heartbeat_reports_stop_and_lost_registration(store):
    register(store)
    assert store.heartbeat("w1", T0 + 1) is False
    assert store.request_stop() == 1
    assert store.heartbeat("w1", T0 + 2) is True
    store.deregister("w1")
    assert store.heartbeat("w1", T0 + 3) is None


def test_burst_done(store):
    assert store.burst_done(T0)
    store.enqueue([spec("soon")], T0 + 30)
    assert not store.burst_done(T0)
    assert store.burst_done(T0 - 100)


def test_config_roundtrip_and_defaults(store):
    assert store.config_get("max_retries") == 3
    store.config_set("max_retries", 7)
    assert store.config_all()["max_retries"] == 7


# ==== Core rules ====

@pytest.mark.parametrize("attempts,base,cap,expected", [
    (1, 2, 3600, 2), (2, 2, 3600, 4), (3, 2, 5, 5), (10**6, 2, 3600, 3600), (5, 1, 3600, 1), (3, 2, 0, 0)])
def test_backoff_delay(attempts, base, cap, expected):
    assert queuectl.backoff_delay(attempts, base, cap) == expected


def make_job(**kw):
    fields = dict(id="j", command="true", state="processing", attempts=0, max_retries=3, timeout=0.0, cwd="/",
                  env={}, created_at=T0, updated_at=T0, next_run_at=T0, last_error=None, exit_code=None,
                  worker_id="w", run_count=1, lost_count=0, priority=0, queue="default", waiting_on=0)
    fields.update(kw)
    return queuectl.Job(**fields)


def test_failure_rule_counts_runs():
    fail = outcome(1, "exit code 1")
    assert queuectl.failure_rule(make_job(), outcome(), SETTINGS, T0)[0] == "completed"
    assert queuectl.failure_rule(make_job(), fail, SETTINGS, T0) == ("failed", 1, T0 + 2)
    assert queuectl.failure_rule(make_job(attempts=2), fail, SETTINGS, T0) == ("dead", 3, T0)
    assert queuectl.failure_rule(make_job(max_retries=0), fail, SETTINGS, T0)[0] == "dead"
    timed_out = queuectl.Outcome(None, "timed out after 1s", "", 1.0)
    assert queuectl.failure_rule(make_job(), timed_out, SETTINGS, T0)[0] == "failed"


def test_recovery_rule_and_lease():
    assert queuectl.interrupt_rule(1, True, False) == ("pending", None)
    assert queuectl.interrupt_rule(3, True, False)[0] == "dead"
    assert queuectl.interrupt_rule(5, False, False) == ("pending", None)  # a stop is never capped
    assert queuectl.interrupt_rule(0, False, True) == ("dead", "canceled")
    assert not queuectl.lease_expired(100.0, 110.0, 10)
    assert queuectl.lease_expired(100.0, 110.5, 10)


def test_parse_json_rejects_hostile_input():
    for text in ('{"a": NaN}', '{"a": 1e309}', '{"a": 1, "a": 2}', '[' * 100000, '{"a": ' + "9" * 5000 + '}'):
        with pytest.raises(queuectl.UsageError):
            queuectl.parse_json(text)
    assert queuectl.parse_json('{"a": -0}') == {"a": 0}


def test_validate_job_fills_defaults_and_names_unknown_fields():
    defaults = {"max_retries": 5, "job_timeout": 7}
    job = queuectl.validate_job({"command": "ls"}, defaults, "/tmp", T0)
    assert (job["max_retries"], job["timeout"], job["cwd"], job["env"]) == (5, 7.0, "/tmp", {})
    assert len(job["id"]) == 16
    with pytest.raises(queuectl.UsageError, match="max_retry"):
        queuectl.validate_job({"command": "ls", "max_retry": 1}, defaults, "/tmp", T0)
    with pytest.raises(queuectl.UsageError, match="surrogate"):
        queuectl.validate_job({"command": "echo \udcff"}, defaults, "/tmp", T0)


# ==== Execution ====

def run(command, timeout=0.0, abort=lambda: None, cwd="/", env=None):
    job = make_job(command=command, timeout=timeout, cwd=cwd, env=env or {})
    return queuectl.run_command(job, {"QUEUECTL_RUN": f"test/{os.getpid()}/{time.monotonic()}"}, abort)


def test_run_command_captures_interleaved_output_and_exit_code():
    out = run("echo one; echo two >&2; exit 4")
    assert (out.exit_code, out.error, out.output) == (4, "exit code 4", b"one\ntwo\n")


def test_run_command_keeps_only_the_tail():
    out = run("head -c 300000 /dev/zero | tr '\\0' a; echo END")
    assert out.exit_code == 0
    assert len(out.output) == queuectl.OUTPUT_TAIL_BYTES and out.output.endswith(b"aEND\n")
    assert out.output_bytes == 300000 + 4


def test_run_command_timeout_kills_the_group(tmp_path):
    marker = tmp_path / "child.pid"
    out = run(f"sleep 30 & echo $! > {marker}; wait", timeout=0.5)
    assert out.exit_code is None and "timed out" in out.error
    child = int(marker.read_text())
    wait_for(lambda: queuectl.proc_start_time(child) is None, "the timed-out job's child to die")


def test_run_command_abort_is_an_interruption():
    out = run("sleep 30", abort=lambda: "worker hard stop")
    assert out.interrupted and "hard stop" in out.error


def test_run_command_missing_cwd_and_signal():
    missing = run("true", cwd="/no/such/dir")
    assert missing.exit_code is None and "cannot start" in missing.error and "/no/such/dir" in missing.error
    killed = run("kill -TERM $$")
    assert killed.exit_code == 128 + 15 and "SIGTERM" in killed.error


def test_run_command_does_not_wait_for_background_children():
    out = run("sleep 30 >/dev/null 2>&1 & echo started")
    assert out.exit_code == 0 and out.output == b"started\n"
    out = run("(sleep 30 &) ; echo held")  # the background child keeps the pipe open
    assert out.exit_code == 0 and out.output == b"held\n"


# ==== Process identity ====

def test_process_identity_of_self_and_of_a_gone_process():
    me = queuectl.host_identity()
    assert me["proc_start"] == queuectl.proc_start_time(os.getpid())
    assert not queuectl.process_gone(os.getpid(), me["proc_start"])
    assert queuectl.process_gone(os.getpid(), "1")  # same PID, other start time: recycled
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert queuectl.process_gone(proc.pid, "whatever")


def test_kill_run_orphans_finds_processes_by_token():
    env = {**os.environ, "QUEUECTL_RUN": "w/1/job"}
    proc = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], env={**os.environ, "QUEUECTL_RUN": "w/1/job2"})
    try:
        assert queuectl.kill_run_orphans("w/1/job") == 1
        assert proc.wait(timeout=10) == -9
        assert other.poll() is None  # a different run's process is left alone
    finally:
        other.kill()
        other.wait()


# ==== Workers ====

def test_worker_run_once_with_injected_runner(store):
    register(store)
    store.enqueue([spec("a")], T0)
    worker = queuectl.Worker(store, "w1", lambda job_id: None)
    seen = {}

    def fake_runner(job, env, abort, on_output):
        seen.update(env)
        return outcome(1, "exit code 1", "boom")
    worker.runner = fake_runner
    assert worker.run_once(now=T0) is True
    assert worker.run_once(now=T0) is False  # backing off until T0 + 2
    job = store.get("a")
    assert (job.state, job.attempts, job.next_run_at) == ("failed", 1, T0 + 2)
    assert seen["QUEUECTL_JOB_ID"] == "a" and seen["QUEUECTL_ATTEMPT"] == "1"
    assert seen["QUEUECTL_RUN"] == "w1/1/a"


def test_sweeper_recovers_dead_local_worker_at_once(store):
    me = queuectl.host_identity()
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.register("dead", {**me, "pid": dead.pid, "proc_start": "1"}, 1, T0)
    store.register("me", me, 1, T0)
    store.enqueue([spec("a")], T0)
    store.claim("dead", T0)
    sweeper = queuectl.Sweeper(store, me, "me")
    assert sweeper.sweep(T0 + 1) == 1
    job = store.get("a")
    assert (job.state, job.attempts, job.lost_count) == ("pending", 0, 1)
    assert [w.id for w in store.workers()] == ["me"]


def test_sweeper_keeps_live_local_worker(store):
    me = queuectl.host_identity()
    store.register("alive", me, 1, T0)
    store.enqueue([spec("a")], T0)
    store.claim("alive", T0)
    assert queuectl.Sweeper(store, me, "other").sweep(T0 + 10**6) == 0
    assert store.get("a").state == "processing"


def test_sweeper_uses_lease_on_its_own_clock_for_remote_workers(store):
    me = queuectl.host_identity()
    store.register("remote", {**me, "boot_id": "other-boot"}, 1, T0)
    store.enqueue([spec("a")], T0)
    store.claim("remote", T0)
    sweeper = queuectl.Sweeper(store, me, "me")
    # The remote heartbeat's wall-clock time is never compared with ours, only whether it moves.
    assert sweeper.sweep(T0, now_mono=1000.0) == 0
    store.heartbeat("remote", T0 - 10**6)  # a clock far behind still counts as a beat
    assert sweeper.sweep(T0, now_mono=1009.0) == 0
    assert sweeper.sweep(T0, now_mono=1018.0) == 0  # 9 s since the beat moved: within 10 s
    assert sweeper.sweep(T0, now_mono=1020.0) == 1
    assert store.get("a").state == "pending"


def test_sweeper_requeues_jobs_of_unregistered_owner(store):
    register(store, "gone")
    store.enqueue([spec("a")], T0)
    store.claim("gone", T0)
    store.write(lambda cur: cur.execute("DELETE FROM workers"))
    assert queuectl.Sweeper(store, queuectl.host_identity(), "me").sweep(T0) == 1
    assert store.get("a").state == "pending"


# ==== CLI ==========================================================================================

# ---- enqueue

def test_enqueue_prints_the_id(db):
    code, out, err = cli(db, "enqueue", '{"id": "job-1", "command": "echo hi"}')
    assert (code, out) == (0, "job-1\n"), err
    assert list_ids(db) == ["job-1"]


def test_enqueue_json_prints_the_job_object(db):
    code, out, err = cli(db, "enqueue", '{"id": "j1", "command": "echo hi"}', "--json")
    assert code == 0, err
    job = json.loads(out)
    assert JOB_KEYS <= job.keys()
    assert job["id"] == "j1" and job["command"] == "echo hi"
    assert job["state"] == "pending"
    assert (job["attempts"], job["max_retries"], job["timeout"]) == (0, 3, 0)
    assert job["cwd"] == os.getcwd()
    assert job["env"] == {}
    assert (job["last_error"], job["exit_code"], job["worker_id"]) == (None, None, None)
    assert job["run_count"] == 0
    for key in ("created_at", "updated_at"):
        parse_iso(job[key])
    assert job["next_run_at"] is None or ISO_UTC.match(job["next_run_at"])
    shown = get_job(db, "j1")
    assert {k: v for k, v in shown.items() if k not in ("output", "runs", "depends_on")} == job
    assert shown["output"] is None


def test_enqueue_stores_every_field(db, tmp_path):
    fields = {"id": "full", "command": "echo hi", "max_retries": 0, "timeout": 2.5,
              "cwd": str(tmp_path), "env": {"A": "1", "B": "x y", "C": ""}}
    job = enqueue(db, **fields)
    for key, value in fields.items():
        assert job[key] == value, key
    assert get_job(db, "full")["env"] == fields["env"]


def test_enqueue_defaults_come_from_config(db):
    ok(db, "config", "set", "max-retries", "7")
    ok(db, "config", "set", "job-timeout", "4.5")
    job = enqueue(db, command="true")
    assert (job["max_retries"], job["timeout"]) == (7, 4.5)


def test_enqueue_generates_a_16_hex_id(db):
    code, out, err = cli(db, "enqueue", '{"command": "true"}')
    assert code == 0, err
    assert re.fullmatch(r"[0-9a-f]{16}\n", out), out
    other = ok(db, "enqueue", '{"command": "true"}')
    assert other != out
    assert list_ids(db) == [out.strip(), other.strip()]


def test_enqueue_duplicate_id_is_refused_and_leaves_the_job_alone(db):
    enqueue(db, id="dup", command="echo one", max_retries=5)
    before = snapshot(db)
    code, out, err = cli(db, "enqueue", '{"id": "dup", "command": "echo two"}')
    assert (code, out) == (1, "")
    assert_one_error(err, "dup")
    assert snapshot(db) == before
    assert get_job(db, "dup")["command"] == "echo one"


@pytest.mark.parametrize("fields", [
    {"command": "x" * 131071},
    {"command": "é" * 65535 + "x"},          # 131071 UTF-8 bytes
    {"command": "true", "id": "i" * 200},
    {"command": "true", "id": "é" * 200},    # 200 characters, 400 bytes
    {"command": "true", "max_retries": 0},
    {"command": "true", "max_retries": 1000000},
    {"command": "true", "timeout": 0},
    {"command": "true", "timeout": 0.25},
    {"command": "true", "cwd": "/"},
    {"command": "true", "env": {}},
], ids=["command-131071-bytes", "command-131071-utf8-bytes", "id-200-chars", "id-200-utf8-chars",
        "max-retries-0", "max-retries-1000000", "timeout-0", "timeout-float", "cwd-root",
        "env-empty"])
def test_enqueue_accepts_values_at_the_limits(db, fields):
    job = enqueue(db, **fields)
    stored = get_job(db, job["id"])
    for key, value in fields.items():
        assert stored[key] == value, key


def _j(**fields):
    return json.dumps(fields)


BAD_ENQUEUE = [  # (test id, JSON text, fragment the error must name or None)
    ("invalid-json", "{", None),
    ("invalid-json-quotes", "{'command': 'true'}", None),
    ("empty-text", "", None),
    ("array", '["true"]', None),
    ("string", '"true"', None),
    ("number", "5", None),
    ("null", "null", None),
    ("missing-command", _j(id="x"), "command"),
    ("blank-command", _j(command=""), "command"),
    ("whitespace-command", _j(command=" \t\n "), "command"),
    ("command-not-string", _j(command=5), "command"),
    ("command-nul", _j(command="echo a\x00b"), "command"),
    ("command-131072-bytes", _j(command="x" * 131072), "command"),
    ("command-131072-utf8-bytes", _j(command="é" * 65536), "command"),
    ("unknown-field", _j(command="true", max_retry=2), "max_retry"),
    ("bool-max-retries", _j(command="true", max_retries=True), "max_retries"),
    ("negative-max-retries", _j(command="true", max_retries=-1), "max_retries"),
    ("float-max-retries", _j(command="true", max_retries=1.5), "max_retries"),
    ("string-max-retries", _j(command="true", max_retries="3"), "max_retries"),
    ("huge-max-retries", _j(command="true", max_retries=1000001), "max_retries"),
    ("max-retries-1e309", '{"command": "true", "max_retries": 1e309}', None),
    ("nan-timeout", '{"command": "true", "timeout": NaN}', None),
    ("infinity-timeout", '{"command": "true", "timeout": Infinity}', None),
    ("timeout-1e309", '{"command": "true", "timeout": 1e309}', None),
    ("negative-timeout", _j(command="true", timeout=-1), "timeout"),
    ("string-timeout", _j(command="true", timeout="5"), "timeout"),
    ("relative-cwd", _j(command="true", cwd="tmp"), "cwd"),
    ("cwd-not-string", _j(command="true", cwd=5), "cwd"),
    ("env-array", _j(command="true", env=["A=1"]), "env"),
    ("env-string", _j(command="true", env="A=1"), "env"),
    ("env-value-not-string", _j(command="true", env={"A": 1}), "env"),
    ("env-empty-key", _j(command="true", env={"": "x"}), "env"),
    ("env-key-with-equals", _j(command="true", env={"A=B": "x"}), "env"),
    ("env-key-with-nul", _j(command="true", env={"A\x00B": "x"}), "env"),
    ("id-control-char", _j(command="true", id="a\x01b"), None),
    ("id-newline", _j(command="true", id="a\nb"), None),
    ("id-nul", _j(command="true", id="a\x00b"), None),
    ("id-del", _j(command="true", id="a\x7fb"), None),
    ("id-201-chars", _j(command="true", id="i" * 201), None),
    ("empty-id", _j(command="true", id=""), None),
    ("id-not-string", _j(command="true", id=5), None),
    ("duplicate-keys", '{"command": "true", "command": "false"}', None),
    ("duplicate-id-keys", '{"id": "a", "command": "true", "id": "b"}', None),
]


@pytest.mark.parametrize("text, fragment", [case[1:] for case in BAD_ENQUEUE],
                         ids=[case[0] for case in BAD_ENQUEUE])
def test_enqueue_rejects_bad_input_and_changes_nothing(seeded_db, text, fragment):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", text)
    assert (code, out) == (2, ""), err
    assert_one_error(err, *([fragment] if fragment else []))
    assert snapshot(seeded_db) == before


# ---- list

def test_list_is_oldest_first_and_limit_keeps_the_newest(db):
    names = ["j-zeta", "j-alpha", "j-mid", "j-beta"]  # not in alphabetical order on purpose
    for name in names:
        enqueue(db, id=name, command="true")
    assert list_ids(db) == names
    assert list_ids(db, "--limit", "2") == ["j-mid", "j-beta"]
    assert list_ids(db, "--limit", "10") == names
    text = ok(db, "list")
    assert [text.index(name) for name in names] == sorted(text.index(name) for name in names)
    limited = ok(db, "list", "--limit", "2")
    assert "j-zeta" not in limited and "j-alpha" not in limited
    assert limited.index("j-mid") < limited.index("j-beta")


def test_list_json_is_only_json(db):
    assert json.loads(ok(db, "list", "--json")) == []
    enqueue(db, id="a", command="echo a")
    jobs = json.loads(ok(db, "list", "--json"))
    assert [job["id"] for job in jobs] == ["a"]
    assert JOB_KEYS <= jobs[0].keys()


def test_list_state_filter(ran_db):
    assert list_ids(ran_db, "--state", "completed") == ["ok1"]
    assert list_ids(ran_db, "--state", "dead") == ["bad1"]
    assert list_ids(ran_db, "--state", "pending") == ["p1"]
    assert list_ids(ran_db, "--state", "failed") == []
    assert list_ids(ran_db, "--state", "processing") == []
    assert list_ids(ran_db) == ["ok1", "bad1", "p1"]
    text = ok(ran_db, "list", "--state", "dead")
    assert "bad1" in text and "ok1" not in text and "p1" not in text


def test_list_unknown_state_lists_the_valid_ones(ran_db):
    code, out, err = cli(ran_db, "list", "--state", "bogus")
    assert (code, out) == (2, "")
    assert "Traceback" not in err
    line = [line for line in err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(line) == 1, err
    for state in STATES:
        assert state in line[0], (state, err)


# ---- status

def test_status_json_shape(ran_db):
    data = json.loads(ok(ran_db, "status", "--json"))
    assert data == {"jobs": {"pending": 1, "processing": 0, "completed": 1, "failed": 0, "dead": 1},
                    "active_workers": 0, "paused": []}
    text = ok(ran_db, "status")
    for state in STATES:
        assert state in text
    assert "worker" in text.lower()


def test_status_of_an_empty_db(db):
    data = json.loads(ok(db, "status", "--json"))
    assert data == {"jobs": {state: 0 for state in STATES}, "active_workers": 0, "paused": []}


# ---- show / logs

def test_show_and_logs(ran_db):
    shown = get_job(ran_db, "ok1")
    assert shown["state"] == "completed" and shown["output"] == "hi\n"
    assert shown["exit_code"] == 0
    assert ok(ran_db, "logs", "ok1") == "hi\n"
    assert ok(ran_db, "logs", "bad1") == "oops\n"
    assert get_job(ran_db, "bad1")["exit_code"] == 4
    text = ok(ran_db, "show", "ok1")
    assert "ok1" in text and "completed" in text


def test_logs_of_a_job_that_never_ran_prints_nothing(db):
    enqueue(db, id="new", command="echo never")
    assert cli(db, "logs", "new") == (0, "", "")
    assert get_job(db, "new")["output"] is None


@pytest.mark.parametrize("command", ["show", "logs"])
def test_show_and_logs_of_unknown_id_exit_1(db, command):
    enqueue(db, id="exists", command="true")
    code, out, err = cli(db, command, "missing-id")
    assert (code, out) == (1, "")
    assert_one_error(err, "missing-id")


# ---- dlq

def test_dlq_list_is_list_of_dead(ran_db):
    assert ok(ran_db, "dlq", "list", "--json") == ok(ran_db, "list", "--state", "dead", "--json")
    assert "bad1" in ok(ran_db, "dlq", "list")


@pytest.mark.parametrize("ids", [["p1"], ["ok1"], ["missing"], ["bad1", "p1"], ["p1", "bad1"],
                                 ["bad1", "missing"]],
                         ids=["pending", "completed", "missing", "dead+pending", "pending+dead",
                              "dead+missing"])
def test_dlq_retry_refuses_unless_every_id_is_dead(ran_db, ids):
    before = snapshot(ran_db)
    code, out, err = cli(ran_db, "dlq", "retry", *ids)
    assert (code, out) == (1, "")
    assert_one_error(err)
    assert snapshot(ran_db) == before
    assert get_job(ran_db, "bad1")["state"] == "dead"


def test_dlq_retry_moves_dead_jobs_to_pending(ran_db):
    assert get_job(ran_db, "bad1")["attempts"] == 1
    assert ok(ran_db, "dlq", "retry", "bad1") == "bad1\n"
    job = get_job(ran_db, "bad1")
    assert (job["state"], job["attempts"]) == ("pending", 0)
    if job["next_run_at"] is not None:
        assert parse_iso(job["next_run_at"]).timestamp() <= time.time() + 1
    assert list_ids(ran_db, "--state", "dead") == []


# ---- config

def test_config_defaults(db):
    assert json.loads(ok(db, "config", "list", "--json")) == CONFIG_DEFAULTS
    assert ok(db, "config", "get", "max-retries") == "3\n"
    assert float(ok(db, "config", "get", "backoff-base")) == 2
    text = ok(db, "config", "list")
    for key, value in CONFIG_DEFAULTS.items():
        assert re.search(rf"^{key} = {value}(\.0)?$", text, re.M), (key, text)


@pytest.mark.parametrize("set_key, get_key", [("max-retries", "max_retries"),
                                              ("max_retries", "max-retries")])
def test_config_accepts_hyphens_and_underscores(db, set_key, get_key):
    assert cli(db, "config", "set", set_key, "5")[0] == 0
    assert ok(db, "config", "get", get_key) == "5\n"
    assert ok(db, "config", "get", set_key) == "5\n"
    assert json.loads(ok(db, "config", "list", "--json"))["max-retries"] == 5


def test_config_set_every_key(db):
    values = {"max-retries": "0", "backoff-base": "1.5", "backoff-max": "0", "stale-timeout": "0.5",
              "job-timeout": "30", "retention": "2"}
    for key, value in values.items():
        ok(db, "config", "set", key, value)
    stored = json.loads(ok(db, "config", "list", "--json"))
    assert stored == {key: float(value) for key, value in values.items()}
    ok(db, "config", "set", "retention", "12h")
    assert ok(db, "config", "get", "retention") == "43200\n"
    assert isinstance(stored["max-retries"], int)
    assert float(ok(db, "config", "get", "backoff_base")) == 1.5
    assert "backoff-base = 1.5" in ok(db, "config", "list")


@pytest.mark.parametrize("key, value", [
    ("max-retries", "-1"), ("max-retries", "1.5"), ("max-retries", "abc"), ("max-retries", ""),
    ("max-retries", "nan"), ("backoff-base", "0.5"), ("backoff-base", "0"), ("backoff-base", "nan"),
    ("backoff-base", "abc"), ("backoff-max", "-1"), ("backoff-max", "nan"), ("stale-timeout", "0"),
    ("stale-timeout", "-3"), ("stale-timeout", "nan"), ("stale-timeout", "abc"),
    ("job-timeout", "-1"), ("job-timeout", "nan"), ("job-timeout", "abc"), ("max_retries", "-1"),
])
def test_config_set_rejects_bad_values(seeded_db, key, value):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", key, value)
    assert (code, out) == (2, ""), err
    assert_one_error(err, value)
    assert snapshot(seeded_db) == before


@pytest.mark.parametrize("args", [("set", "bogus", "1"), ("get", "bogus"), ("set", "max-retry", "1")])
def test_config_unknown_key_lists_the_valid_keys(seeded_db, args):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", *args)
    assert (code, out) == (2, "")
    assert_one_error(err, args[1], *CONFIG_KEYS)
    assert snapshot(seeded_db) == before


# ---- worker stop without workers

def test_worker_stop_with_no_workers(db):
    code, out, err = cli(db, "worker", "stop")
    assert code == 0, err
    assert out == "asked 0 workers to stop\n"


# ---- global options, argparse, the db file

def test_version(db):
    code, out, err = cli(db, "--version")
    assert code == 0, err
    assert queuectl.__version__ in out
    result = subprocess.run([sys.executable, QUEUECTL, "--version"], capture_output=True,
                            text=True, timeout=WAIT_S, env=child_env())
    assert result.returncode == 0 and queuectl.__version__ in result.stdout


def test_help_exits_0(db):
    code, out, err = cli(db, "--help")
    assert code == 0 and "enqueue" in out


@pytest.mark.parametrize("args", [("bogus",), ("show",), ("enqueue",), ("dlq", "retry"),
                                  ("config", "set", "max-retries"), ("list", "--limit", "x"),
                                  ("status", "--bogus")])
def test_argparse_errors_exit_2(db, args):
    code, out, err = cli(db, *args)
    assert_argparse_error(code, err)


def test_argparse_error_from_the_real_script_is_named_queuectl(db):
    result = script(db, "bogus")
    assert_argparse_error(result.returncode, result.stderr)


def test_db_path_from_environment(tmp_path, monkeypatch):
    env_db = str(tmp_path / "from-env.db")
    monkeypatch.setenv("QUEUECTL_DB", env_db)
    assert run_main(["enqueue", '{"id": "e", "command": "true"}'])[0] == 0
    assert os.path.exists(env_db)
    assert run_main(["show", "e"])[0] == 0
    other = str(tmp_path / "other.db")
    assert run_main(["--db", other, "show", "e"])[0] == 1  # --db wins over $QUEUECTL_DB


def test_db_path_defaults_to_queuectl_db_in_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_main(["enqueue", '{"id": "d", "command": "true"}'])[0] == 0
    assert os.path.exists(tmp_path / "queuectl.db")


def test_db_file_is_created_with_mode_0600(db):
    old_umask = os.umask(0o022)
    try:
        ok(db, "enqueue", '{"command": "true"}')
    finally:
        os.umask(old_umask)
    assert os.stat(db).st_mode & 0o777 == 0o600
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db + suffix):
            assert os.stat(db + suffix).st_mode & 0o077 == 0, suffix


DB_COMMANDS = [("status",), ("list",), ("enqueue", '{"command": "true"}'),
               ("config", "set", "max-retries", "5"), ("config", "list"), ("show", "x")]


@pytest.mark.parametrize("args", DB_COMMANDS, ids=lambda args: "-".join(args[:2]))
def test_a_file_that_is_not_a_database_is_refused_untouched(db, args):
    garbage = b"this is not a database\n\x00\xff" * 200
    with open(db, "wb") as f:
        f.write(garbage)
    code, out, err = cli(db, *args)
    assert (code, out) == (1, "")
    assert_one_error(err)
    with open(db, "rb") as f:
        assert f.read() == garbage


def _foreign_db(path):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE foo (x TEXT)")
    conn.execute("INSERT INTO foo VALUES ('mine')")
    conn.commit()
    conn.close()
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("args", DB_COMMANDS, ids=lambda args: "-".join(args[:2]))
def test_another_apps_sqlite_db_is_refused_untouched(db, args):
    before = _foreign_db(db)
    code, out, err = cli(db, *args)
    assert (code, out) == (1, "")
    assert_one_error(err)
    with open(db, "rb") as f:
        assert f.read() == before
    assert not os.path.exists(db + "-wal") or os.path.getsize(db + "-wal") == 0


def test_a_db_with_a_newer_schema_is_refused_untouched(db):
    enqueue(db, id="old", command="true")
    conn = sqlite3.connect(db)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute(f"PRAGMA user_version = {version + 1000}")
    conn.commit()
    conn.close()
    with open(db, "rb") as f:
        before = f.read()
    for args in DB_COMMANDS:
        code, out, err = cli(db, *args)
        assert (code, out) == (1, ""), args
        assert_one_error(err)
    with open(db, "rb") as f:
        assert f.read() == before


# ==== End to end ===================================================================================

def test_burst_worker_runs_a_job_and_captures_its_output(db, workers, tmp_path):
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    command = ('echo "id=$QUEUECTL_JOB_ID attempt=$QUEUECTL_ATTEMPT foo=$FOO"; '
               'echo "cwd=$(pwd -P)"; echo "to stderr" >&2; echo last')
    enqueue(db, id="e1", command=command, cwd=str(workdir), env={"FOO": "bar baz"})
    enqueue(db, id="e2", command=r"printf 'a\377b\n'", cwd=str(tmp_path))
    enqueue(db, id="e3", command="yes x | head -c 200000; echo END", cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()

    job = get_job(db, "e1")
    assert (job["state"], job["exit_code"], job["attempts"], job["run_count"]) == \
        ("completed", 0, 0, 1)
    expected = (f"id=e1 attempt=1 foo=bar baz\ncwd={os.path.realpath(workdir)}\n"
                "to stderr\nlast\n")
    assert cli(db, "logs", "e1") == (0, expected, "")
    assert job["output"] == expected
    assert ok(db, "logs", "e2") == "a\ufffdb\n"
    tail = ok(db, "logs", "e3")
    assert tail.endswith("x\nEND\n") and 32768 < len(tail.encode()) <= 65536, len(tail)
    assert get_job(db, "e3")["state"] == "completed"

    log = worker.log()
    assert "worker started" in log
    for word in ("claimed", "completed"):
        assert any(word in line and "e1" in line for line in log.splitlines()), (word, log)
    assert json.loads(ok(db, "status", "--json"))["active_workers"] == 0


def test_failing_job_is_retried_with_backoff_then_dead(db, workers, tmp_path):
    ok(db, "config", "set", "backoff-base", "1")
    command = 'date +%s.%N >> times; echo "try $QUEUECTL_ATTEMPT"; echo boom >&2; exit 3'
    enqueue(db, id="f1", command=command, max_retries=2, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()

    job = get_job(db, "f1")
    assert (job["state"], job["attempts"], job["exit_code"], job["run_count"]) == ("dead", 2, 3, 2)
    assert ok(db, "logs", "f1") == "try 2\nboom\n"
    starts = [float(line) for line in (tmp_path / "times").read_text().split()]
    assert len(starts) == 2
    assert starts[1] - starts[0] >= 0.9  # backoff-base 1 => 1 s before the second try
    log = worker.log().splitlines()
    for word in ("failed", "dead"):
        assert any(word in line and "f1" in line for line in log), word


def test_timeout_kills_the_whole_job_and_fails_it(db, workers, tmp_path):
    command = 'sleep 30 & echo $! > sleep.pid; echo $$ > sh.pid; wait'
    enqueue(db, id="t1", command=command, timeout=1, max_retries=0, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait(timeout=25) == 0, worker.log()  # well before the sleep would end

    job = get_job(db, "t1")
    assert job["state"] == "dead" and job["attempts"] == 1
    assert "timed out" in job["last_error"]
    for name in ("sh.pid", "sleep.pid"):
        pid = int((tmp_path / name).read_text())
        wait_for(lambda: pid_gone(pid), f"{name} process {pid} to be killed", timeout=10)


def _wait_started(tmp_path):
    wait_for(lambda: (tmp_path / "started").exists(), "the job to start")


def test_worker_stop_makes_a_running_worker_exit(db, workers):
    worker = workers.start()
    worker.wait_log("worker started")
    assert json.loads(ok(db, "status", "--json"))["active_workers"] == 1
    result = script(db, "worker", "stop")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "asked 1 worker to stop\n"
    assert worker.wait() == 0, worker.log()
    assert "stopping" in worker.log()
    assert json.loads(ok(db, "status", "--json"))["active_workers"] == 0


def test_worker_stop_wait_times_out_while_a_job_runs_then_it_finishes(db, workers, tmp_path):
    enqueue(db, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    result = script(db, "worker", "stop", "--wait", "--timeout", "1")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert_one_error(result.stderr)
    assert worker.popen.poll() is None  # it lets the running job finish
    (tmp_path / "release").touch()
    assert worker.wait() == 0, worker.log()
    job = get_job(db, "long")
    assert job["state"] == "completed" and job["output"].endswith("finished\n")


def test_worker_stop_wait_returns_once_workers_exited(db, workers):
    worker = workers.start()
    worker.wait_log("worker started")
    result = script(db, "worker", "stop", "--wait", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    assert worker.wait() == 0, worker.log()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_first_signal_lets_the_running_job_finish(db, workers, tmp_path, sig):
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start("--count", "2")
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    worker.signal(sig)
    worker.wait_log("stopping")
    enqueue(db, id="late", command="true")
    # A free thread must not claim anything once stopping: watch for a moment, then release.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert get_job(db, "late")["state"] == "pending"
        time.sleep(0.1)
    assert worker.popen.poll() is None
    (tmp_path / "release").touch()
    assert worker.wait() == 0, worker.log()
    job = get_job(db, "run")
    assert (job["state"], job["attempts"]) == ("completed", 0)
    assert ok(db, "logs", "run").endswith("finished\n")
    late = get_job(db, "late")
    assert (late["state"], late["attempts"], late["run_count"]) == ("pending", 0, 0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_second_signal_kills_the_job_and_requeues_it(db, workers, tmp_path, sig):
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    shell_pid = int((tmp_path / "sh.pid").read_text())
    worker.signal(sig)
    worker.wait_log("stopping")  # two signals back to back would merge into one (FACTS.md)
    worker.signal(sig)
    assert worker.wait() == 130, worker.log()
    job = get_job(db, "run")
    assert (job["state"], job["attempts"]) == ("pending", 0)
    wait_for(lambda: pid_gone(shell_pid), "the job's shell to be killed", timeout=10)
    assert not (tmp_path / "release").exists()


def test_a_killed_workers_job_is_recovered_by_another_worker(db, workers, tmp_path):
    command = ('if [ -e first ]; then echo second run; '
               'else echo $$ > sh.pid; touch first; sleep 60; fi')
    enqueue(db, id="k1", command=command, cwd=str(tmp_path))
    victim = workers.start()
    victim.wait_log("worker started")
    wait_for(lambda: (tmp_path / "first").exists(), "the first run to start")
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert get_job(db, "k1")["state"] == "processing"

    rescuer = workers.start("--burst")
    assert rescuer.wait(timeout=90) == 0, rescuer.log()
    job = get_job(db, "k1")
    assert (job["state"], job["attempts"]) == ("completed", 0)
    assert ok(db, "logs", "k1") == "second run\n"


def test_a_job_whose_worker_is_lost_3_times_goes_dead(db, workers, tmp_path):
    enqueue(db, id="doomed", command="echo run >> runs; sleep 60", cwd=str(tmp_path))
    runs = tmp_path / "runs"
    for lost in range(1, 4):
        victim = workers.start()
        wait_for(lambda: runs.exists() and len(runs.read_text().split()) == lost,
                 f"run {lost} to start")
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
    rescuer = workers.start("--burst")
    assert rescuer.wait(timeout=90) == 0, rescuer.log()
    job = get_job(db, "doomed")
    assert job["state"] == "dead"
    assert "worker lost 3 times" in job["last_error"]
    assert len(runs.read_text().split()) == 3


def test_burst_worker_exits_when_nothing_is_due_within_60_s(db, workers, tmp_path):
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()  # empty queue
    ok(db, "config", "set", "backoff-base", "100")
    enqueue(db, id="later", command="exit 1", max_retries=3, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    job = get_job(db, "later")
    assert (job["state"], job["attempts"]) == ("failed", 1)
    assert parse_iso(job["next_run_at"]).timestamp() > time.time() + 60
