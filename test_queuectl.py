"""Tests for queuectl, grouped by feature: shared helpers, fixtures and constants first, then one section
per section of queuectl.py, in its order, each holding the tests of its features (unit, command and end
to end together; a feature's own helpers open its subsection), and the benchmark script's tests last.

Run with `python3 -m pytest -q test_queuectl.py`. The end-to-end tests start real worker processes;
every wait polls with a deadline, so they stay deterministic on a slow, noisy machine.
"""

import _thread
import collections
import contextlib
import io
import json
import marshal
import math
import os
import pty
import random
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zoneinfo
from datetime import datetime, timezone

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import queuectl  # noqa: E402  (imported from this test file's folder)

QUEUECTL = os.path.join(HERE, "queuectl.py")


# ==== Helpers =====================================================================================

STATES = ("pending", "processing", "completed", "failed", "dead")
CONFIG_KEYS = ("max-retries", "backoff-base", "backoff-max", "stale-timeout", "job-timeout", "retention",
               "output-limit", "kill-grace", "on-dead")
CONFIG_DEFAULTS = {"max-retries": 3, "backoff-base": 2, "backoff-max": 3600, "stale-timeout": 10, "job-timeout": 0,
                   "retention": 604800, "output-limit": 65536, "kill-grace": 10, "on-dead": ""}
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


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path, monkeypatch):
    """`--db` of a fresh, empty queue on each backend: an SQLite file in a temp folder, and a PostgreSQL
    schema (pg_url); $QUEUECTL_DB cleared so it cannot interfere."""
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
    return str(tmp_path / "queue.db")


@pytest.fixture
def sqlite_db(tmp_path, monkeypatch):
    """Path of a fresh SQLite database file, for tests of what only a file has (its modes, WAL, locks,
    corruption, permissions)."""
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    return str(tmp_path / "queue.db")


def is_pg(db):
    return queuectl.is_postgres(db)


# For a test of argument or input checks that refuse a request in Python before anything is written
# (argparse, validate_job, a bad id or duration): it cannot differ between backends, so it runs on
# SQLite only; `db` and the fixtures built on it (seeded_db, states_db, ...) get only its sqlite param.
sqlite_only = pytest.mark.parametrize("db", ["sqlite"], indirect=True)


class TerminalOutput(io.StringIO):
    """A stdout taken for a terminal (its width: $COLUMNS, which a test sets)."""
    def isatty(self):
        return True


def run_main(argv, stdin=None, terminal=False):
    """Call queuectl.main(argv) in-process; return (exit code, stdout, stderr).

    stdin (str or bytes) is given a byte layer like the real one: `enqueue -` reads sys.stdin.buffer.
    terminal: stdout answers isatty() with True.
    """
    out, err = TerminalOutput() if terminal else io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    if stdin is not None:
        data = stdin.encode() if isinstance(stdin, str) else stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = queuectl.main(list(argv))
    finally:
        sys.stdin = saved_stdin
    return code, out.getvalue(), err.getvalue()


def cli(db, *args, stdin=None):
    """`queuectl --db DB ARGS...` in-process; return (exit code, stdout, stderr)."""
    return run_main(["--db", db, *args], stdin=stdin)


def on_a_terminal(db, *args):
    """The stdout of a command that must succeed, run with stdout on a terminal."""
    code, out, err = run_main(["--db", db, *args], terminal=True)
    assert (code, err) == (0, ""), (args, code, err)
    return out


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
    """Everything the CLI can see of the db (jobs with their runs and dependencies, config, paused
    queues); compared before/after a rejected request."""
    jobs = ok(db, "list", "--json")
    shown = {job["id"]: ok(db, "show", job["id"], "--json") for job in json.loads(jobs)}
    paused = json.loads(ok(db, "status", "--json"))["paused"]
    return jobs, shown, ok(db, "config", "list", "--json"), paused


def sql(db, statement, params=()):
    """Run one statement on an SQLite db file directly, with sqlite3 (PRAGMAs); returns the rows."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        with conn:
            return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def db_sql(db, statement, params=()):
    """Run one plain-SQL statement that both dialects accept (parameters as ?) in one transaction of
    the backend's own Store (to age a row or count runs); returns the rows, [] if it returns none."""
    with opened(db) as s:
        if is_pg(db):
            statement = statement.replace("?", "%s")

        def run(cur):
            cur.execute(statement, params)
            return [tuple(row) for row in cur.fetchall()] if cur.description else []
        return s.write(run)


def run_counts(db):
    """job id -> number of rows in its run history, straight from the runs table."""
    return dict(db_sql(db, "SELECT job_id, count(*) FROM runs GROUP BY job_id"))


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


def ok_when_free(db, *args):
    """`ok` for a command run while workers write: retry while the db is reported busy."""
    deadline = time.monotonic() + WAIT_S
    while True:
        code, out, err = cli(db, *args)
        if code == 0:
            assert "Traceback" not in err
            return out
        assert code == 1 and "busy" in err and time.monotonic() < deadline, (args, code, out, err)
        time.sleep(0.05)


def state_of(db, job_id):
    return get_job(db, job_id)["state"]


class LineReader:
    """Collects a pipe's lines in a background thread, so a test can wait for them with a deadline."""

    def __init__(self, pipe):
        self.pipe, self.lines = pipe, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in iter(self.pipe.readline, b""):
            self.lines.append(line.decode("utf-8", "replace"))

    def text(self):
        return "".join(self.lines)


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


def script_stdin(db, data, *args, timeout=WAIT_S):
    """Run the real script with `data` (bytes) on its stdin; stdout and stderr decoded as text."""
    result = subprocess.run([sys.executable, QUEUECTL, "--db", db, *args], input=data,
                            capture_output=True, timeout=timeout, env=child_env())
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                       result.stderr.decode())


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
        self.others = []  # other queuectl commands started with spawn()

    def spawn(self, *args, stdout=subprocess.PIPE):
        """Start another real queuectl command (logs --follow, wait, status --watch) under this tag."""
        # SIGINT back to its default, so Python turns it into KeyboardInterrupt as it does at a
        # terminal, even when pytest itself was started with SIGINT ignored (a background job).
        popen = subprocess.Popen([sys.executable, QUEUECTL, "--db", self.db, *args],
                                 stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                                 env=child_env(**{TAG_VAR: self.tag}),
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.others.append(popen)
        return popen

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
        for popen in [proc.popen for proc in self.procs] + self.others:
            if popen.poll() is None:
                popen.kill()
            popen.wait()
            for pipe in (popen.stdout, popen.stderr):
                if pipe is not None:
                    pipe.close()


def the_db(request):
    """The `--db` of the test asking: its sqlite_db if it uses that, else its db (either backend), else
    its pg_url; so fixtures built on it (workers, dashboard) follow the test's own choice."""
    name = next(name for name in ("sqlite_db", "db", "pg_url") if name in request.fixturenames)
    return request.getfixturevalue(name)


@pytest.fixture
def workers(request, tmp_path):
    """Factory for worker processes on the test's db (see the_db); everything they started is killed
    at teardown."""
    pool = Workers(the_db(request), tmp_path)
    try:
        yield pool
    finally:
        pool.cleanup()


@pytest.fixture
def local_tz():
    """Set the process's local time zone (TZ) for one test; the original is restored after."""
    saved = os.environ.get("TZ")

    def set_tz(name):
        os.environ["TZ"] = name
        time.tzset()
    try:
        yield set_tz
    finally:
        if saved is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved
        time.tzset()


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


T0 = 1_800_000_000.0  # a fixed "now" for unit tests


def spec(job_id="j1", command="true", **kw):
    base = {"id": job_id, "command": command, "max_retries": 3, "timeout": 0.0, "cwd": "/", "env": {},
            "priority": 0, "queue": "default", "run_at": None, "depends_on": []}
    base.update(kw)
    return base


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """A fresh Store on each backend: an SQLite file, and a PostgreSQL schema (pg_url)."""
    if request.param == "sqlite":
        s = queuectl.SqliteStore(str(tmp_path / "q.db"))
    else:
        s = queuectl.PostgresStore(request.getfixturevalue("pg_url"))
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path):
    """A fresh SQLite Store, for tests of what only SQLite has (VM steps, the RETURNING fallback, file locks)."""
    s = queuectl.SqliteStore(str(tmp_path / "q.db"))
    yield s
    s.close()


def register(store, worker_id="w1", now=T0):
    identity = {"host": "h", "pid": 1, "proc_start": "1", "boot_id": "b", "pid_ns": "ns"}
    store.register(worker_id, identity, 1, now)


def open_concurrently(open_store, n=8):
    """Open (and close) a Store from n threads at once; the errors they met."""
    errors = []

    def opener():
        try:
            open_store().close()
        except Exception as e:  # noqa: BLE001 - any failure is the bug under test
            errors.append(e)
    threads = [threading.Thread(target=opener) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _vm_steps(store, action) -> int:
    """SQLite virtual-machine instructions (in hundreds) that `action` makes the store execute."""
    steps = [0]

    def count():
        steps[0] += 1
    store.conn.set_progress_handler(count, 100)
    try:
        action()
    finally:
        store.conn.set_progress_handler(None, 100)
    return steps[0]


def outcome(code=0, error=None, output="out", duration=0.01):
    return queuectl.Outcome(code, error, output, duration)


LOST = queuectl.Outcome(None, "worker lost", None, None, interrupted="worker lost")


SETTINGS = {"backoff_base": 2, "backoff_max": 3600}


def finish_next(store, code=0, now=T0, output="out", ended=None, settings=SETTINGS, worker="w1"):
    """Claim the best due job at `now` and finish it with exit `code` at `ended` (default: now)."""
    job = store.claim(worker, now)
    assert job is not None, "nothing due to claim"
    error = None if code == 0 else f"exit code {code}"
    ended = now if ended is None else ended
    # the run's end is its start plus the duration measured on the worker's monotonic clock
    return store.finish(job, worker, outcome(code, error, output, ended - now), settings, ended)


@contextlib.contextmanager
def opened(db):
    """A Store on a CLI test's db, either backend (to build states the CLI cannot reach quickly)."""
    s = queuectl.open_database(db)
    try:
        yield s
    finally:
        s.close()


def claim_ids(store, now, queues=()):
    """Ids claimed one after another at `now` until nothing is claimable."""
    ids = []
    while (job := store.claim("w1", now, queues)) is not None:
        ids.append(job.id)
    return ids


def with_params(url, **params):
    """`url` with query parameters added or replaced."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
    parts = urlsplit(url)
    query = {**dict(parse_qsl(parts.query)), **params}
    return urlunsplit(parts._replace(query=urlencode(query)))


class PgRoles:
    """PostgreSQL roles of one test, named uniquely (roles are shared by every database of the server,
    and other test runs use it too); each is dropped with what it owns and its privileges at teardown."""

    def __init__(self, pg_url):
        from urllib.parse import urlsplit
        self.admin = queuectl._pg_target(pg_url)[0]  # the test server's superuser, without ?schema=
        self.dbname = urlsplit(self.admin).path.lstrip("/")
        self.prefix, self.names = f"qc_{uuid.uuid4().hex[:10]}", []

    def sql(self, *statements, role=None):
        """Run statements in autocommit, as the superuser, or as `role` (a connection of its own)."""
        import psycopg
        with psycopg.connect(self.url(role) if role else self.admin, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def make(self, name, *options):
        """A role named PREFIX_name (CREATE ROLE options such as LOGIN, IN ROLE ...); its full name."""
        full = f"{self.prefix}_{name}"
        self.names.append(full)
        self.sql(f"CREATE ROLE {full} {' '.join(options)}")
        return full

    def url(self, role, schema=None, database=None):
        """The server's URL for `role` (the test server trusts every local role; None: the superuser), with
        ?schema=, and another database."""
        from urllib.parse import urlsplit, urlunsplit
        parts = urlsplit(self.admin)
        parts = parts._replace(path=f"/{database}") if database else parts
        url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}") if role else parts)
        return with_params(url, schema=schema) if schema else url

    def cleanup(self):
        import psycopg
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for name in reversed(self.names):
                conn.execute(f"DROP OWNED BY {name} CASCADE")  # its schemas, tables and grants
                conn.execute(f"DROP ROLE {name}")


def recorded(roles, table):
    """Who a planted function recorded in `table` (read as the superuser)."""
    import psycopg
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        return [who for (who,) in conn.execute(f"SELECT who FROM {table}")]


def make_job(**kw):
    fields = dict(id="j", command="true", state="processing", attempts=0, max_retries=3, timeout=0.0, cwd="/",
                  env={}, created_at=T0, updated_at=T0, next_run_at=T0, last_error=None, exit_code=None,
                  worker_id="w", run_count=1, lost_count=0, priority=0, queue="default", waiting_on=0)
    fields.update(kw)
    return queuectl.Job(**fields)


DEFAULTS = {"max_retries": 3, "job_timeout": 0}
Y2030 = 1893499200.0  # 2030-01-01T12:00:00Z


def run(command, timeout=0.0, abort=lambda: None, cwd="/", env=None):
    job = make_job(command=command, timeout=timeout, cwd=cwd, env=env or {})
    return queuectl.run_command(job, {"QUEUECTL_RUN": f"test/{os.getpid()}/{time.monotonic()}"}, abort)


class InProcessWorker:
    """A Worker run in a thread of the test, whose poll and idle wait are an hour: only a wake-up
    makes an idle runner thread claim. `idle` is set each time a runner's claim found nothing."""

    def __init__(self, target, monkeypatch):
        monkeypatch.setattr(queuectl, "POLL_INTERVAL_S", 3600.0)
        monkeypatch.setattr(queuectl, "NOTIFIED_POLL_INTERVAL_S", 3600.0)  # PostgreSQL's, while its listener hears
        monkeypatch.setattr(queuectl, "IDLE_WAIT_S", 3600.0)
        self.idle = threading.Event()
        real_run_once = queuectl.Runner.run_once

        def run_once(runner, now=None):
            ran = real_run_once(runner, now)
            if not ran:
                self.idle.set()
            return ran
        monkeypatch.setattr(queuectl.Runner, "run_once", run_once)
        self.worker = queuectl.Worker(target, 1, False)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_for(self.idle.is_set, "the runner thread's first claim")
        return self

    def __exit__(self, *exc):
        self.worker._stop("test over")
        self.worker.tick.set()  # end the main loop's hour-long wait
        self.thread.join(WAIT_S)
        self.worker.store.close()


DASH_TOKEN = "test-token-Zq9"
SCRIPT_ID = "<script>alert(1)</script>"  # a job id that must always show as text
CHROMIUM = os.environ.get("QUEUECTL_CHROMIUM", "/usr/bin/chromium")


def seed_dashboard_queue(path):
    """A queue with known contents; returns the Store (kept open, so tests can also read it).

    done-1 completed (output with HTML), SCRIPT_ID dead (output with HTML), running-1 processing
    on a live worker (this test process), img-1 and img-2 pending in queue `images`.
    """
    store = queuectl.open_database(path)
    now = time.time()
    store.register("dash-worker", queuectl.host_identity(), 2, now)

    def add(job_id, command="true", **fields):
        spec = queuectl.validate_job({"id": job_id, "command": command, **fields}, store.config_all(), "/tmp", now)
        store.enqueue([spec], now)

    def run(code, output):
        job = store.claim("dash-worker", now)
        outcome = queuectl.Outcome(code, None if code == 0 else f"exit code {code}", output, 0.25)
        store.finish(job, "dash-worker", outcome, store.config_all(), now + 0.25)

    add("done-1", "echo hello")
    run(0, "hello <b>world</b>\n")
    add(SCRIPT_ID, "exit 3", max_retries=0)
    run(3, "<img src=x onerror=alert(2)>\n")
    add("running-1", "sleep 1000")
    store.claim("dash-worker", now)
    add("img-1", queue="images")
    add("img-2", queue="images")
    return store


class DashboardUnderTest:
    """A queuectl.Dashboard served on a free port by a background thread, with a small HTTP client."""

    def __init__(self, path, token=DASH_TOKEN, allow_actions=False):
        import threading
        self.token = token
        self.dashboard = queuectl.Dashboard(path, token=token, allow_actions=allow_actions)
        self.server = self.dashboard.serve("127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def request(self, path, *, auth="header", method="GET", headers=None):
        """(status, headers, body: parsed JSON, or text) of one request; auth is "header" (the token in
        X-Queuectl-Token) or None (only the headers given)."""
        import urllib.error
        import urllib.request
        headers = dict(headers or {})
        if auth == "header":
            headers["X-Queuectl-Token"] = self.token
        req = urllib.request.Request(self.base + path, method=method, headers=headers,
                                     data=b"" if method == "POST" else None)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via $http_proxy
        try:
            with opener.open(req, timeout=30) as res:
                status, got, body = res.status, res.headers, res.read()
        except urllib.error.HTTPError as e:
            status, got, body = e.code, e.headers, e.read()
        is_json = got.get("Content-Type", "").startswith("application/json")
        return status, got, json.loads(body) if is_json else body.decode()

    def get(self, path, **kw):
        """The JSON of a GET that must answer 200."""
        status, _, body = self.request(path, **kw)
        assert status == 200, (path, status, body)
        return body

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@contextlib.contextmanager
def dashboards(path):
    """start(**options) -> a DashboardUnderTest on a seeded queue at `path` (`.path`, `.store`); all
    stopped at the end."""
    store = seed_dashboard_queue(path)
    started = []

    def start(**options):
        server = DashboardUnderTest(path, **options)
        server.path, server.store = path, store
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.close()
        store.close()


@pytest.fixture
def dashboard(db):
    """Dashboards on a seeded queue in `db` (either backend): see dashboards()."""
    with dashboards(db) as start:
        yield start


HALF_A_REQUEST = b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Queuectl-Token: "  # and then nothing


def cpu_seconds(pid):
    """utime + stime of a running process, from /proc/PID/stat, in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_files(pid):
    """How many descriptors pid has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


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
    ("unit-less-timeout", _j(command="true", timeout="5x"), "timeout"),
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


DB_COMMANDS = [("status",), ("list",), ("enqueue", '{"command": "true"}'),
               ("config", "set", "max-retries", "5"), ("config", "list"), ("show", "x")]


def _without_capabilities():
    """A preexec_fn: empty the bounding set, so the program exec'd next runs as uid 0 with no
    capability. Root then meets file modes like any user (CAP_DAC_OVERRIDE is what ignores them)."""
    import ctypes
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    last = int(open("/proc/sys/kernel/cap_last_cap").read())

    def drop():
        for cap in range(last + 1):
            if prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return drop


BAD_SCHEDULING = [  # (test id, fields, fragment the error must name)
    ("run-at-and-delay", {"run_at": 1893499200, "delay": 5}, "delay"),
    ("run-at-words", {"run_at": "tomorrow"}, "run_at"),
    ("run-at-empty", {"run_at": ""}, "run_at"),
    ("run-at-month-13", {"run_at": "2030-13-01T00:00:00Z"}, "run_at"),
    ("run-at-hour-25", {"run_at": "2030-01-01T25:00:00"}, "run_at"),
    ("run-at-bad-offset", {"run_at": "2030-01-01T12:00:00+25:00"}, "run_at"),
    ("run-at-before-1970", {"run_at": "1969-12-31T00:00:00Z"}, "run_at"),
    ("run-at-negative", {"run_at": -1}, "run_at"),
    ("run-at-huge", {"run_at": 1e13}, "run_at"),
    ("run-at-bool", {"run_at": True}, "run_at"),
    ("run-at-list", {"run_at": [2030]}, "run_at"),
    ("delay-negative", {"delay": -1}, "delay"),
    ("delay-string", {"delay": "10x"}, "delay"),
    ("delay-bool", {"delay": True}, "delay"),
    ("delay-huge", {"delay": 1e10}, "delay"),
    ("priority-string", {"priority": "1"}, "priority"),
    ("priority-float", {"priority": 1.5}, "priority"),
    ("priority-bool", {"priority": True}, "priority"),
    ("priority-huge", {"priority": 10**7}, "priority"),
    ("queue-65-chars", {"queue": "q" * 65}, "queue"),
    ("queue-empty", {"queue": ""}, "queue"),
    ("queue-space", {"queue": "a b"}, "queue"),
    ("queue-slash", {"queue": "a/b"}, "queue"),
    ("queue-unicode", {"queue": "é"}, "queue"),
    ("queue-number", {"queue": 5}, "queue"),
    ("depends-on-string", {"depends_on": "keep"}, "depends_on"),
    ("depends-on-number", {"depends_on": [5]}, "depends_on"),
    ("depends-on-empty-id", {"depends_on": [""]}, "depends_on"),
    ("depends-on-number", {"depends_on": ["a", 1]}, "depends_on[1]"),
    ("run-at-nul", {"run_at": "2030-01-01T00:00:00\u0000"}, "run_at"),
    ("depends-on-newline", {"depends_on": ["a\nb"]}, "depends_on"),
    ("depends-on-1001", {"depends_on": [f"j{i}" for i in range(1001)]}, "depends_on"),
]


def jsonl(*objects):
    return "".join(json.dumps(o) + "\n" for o in objects)


BAD_BATCH_LINE = [  # line 3 (after a good line and a blank one) is bad in each
    ("invalid-json", '{"id": "z", "command": '),
    ("unknown-field", _j(id="z", command="true", colour="red")),
    ("run-at-and-delay", _j(id="z", command="true", run_at=1893499200, delay=1)),
    ("not-an-object", '["true"]'),
    ("missing-command", _j(id="z")),
    ("bad-queue", _j(id="z", command="true", queue="a b")),
]


RUN_KEYS = {"run", "worker_id", "started_at", "ended_at", "outcome", "exit_code", "error", "output", "duration_s"}


@pytest.fixture
def states_db(db):
    """At the real time: done (completed), gone (dead, exit 4), fail (failed, retry in 1000 s),
    wait (pending), all in the default queue; made with a Store, no worker process."""
    now = time.time()
    with opened(db) as s:
        register(s, now=now)
        s.enqueue([spec("done", "echo done")], now)
        finish_next(s, 0, now, "done\n")
        s.enqueue([spec("gone", "exit 4", max_retries=0)], now)
        finish_next(s, 4, now, "oops\n")
        s.enqueue([spec("fail", "exit 1", max_retries=3)], now)
        finish_next(s, 1, now, settings={"backoff_base": 1000, "backoff_max": 3600})
        s.enqueue([spec("wait", "true")], now)
        s.deregister("w1")
    return db


def claim_for_a_fake_worker(db, job_id):
    """Put a pending job into processing, held by a registered (fake) worker that never runs it."""
    enqueue(db, id=job_id, command="true", priority=1000)
    with opened(db) as s:
        register(s, "fake", now=time.time())
        assert s.claim("fake", time.time()).id == job_id


STATS_KEYS = {"window_s", "runs", "throughput_per_min", "duration_s", "wait_s", "oldest_eligible_age_s"}


def _wait_started(tmp_path):
    wait_for(lambda: (tmp_path / "started").exists(), "the job to start")


def _signal_pending(pid, sig):
    """True while a signal sent to the process has not been delivered yet (its ShdPnd bit)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("ShdPnd:"))
    return bool(mask >> (sig - 1) & 1)


@contextlib.contextmanager
def write_locked(db):
    """Hold the database's write lock, as a long `enqueue -` or purge would."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def job_leaders(tag, worker_pid):
    """Pids of the first processes of the jobs a worker started (each leads its own session, as does
    the worker's watchdog on PostgreSQL, which is not a job)."""
    return [pid for pid in tagged_pids(tag) if pid != worker_pid and queuectl._session(pid) == pid
            and queuectl._read(f"/proc/{pid}/comm") != "qctl-watchdog"]


@pytest.fixture
def pg_workers(pg_url, tmp_path):
    """Worker processes on a PostgreSQL queue; everything they started is killed at teardown."""
    pool = Workers(pg_url, tmp_path)
    try:
        yield pool
    finally:
        pool.cleanup()


# A job that holds a lock and a lot of touched memory: once SIGKILLed, it keeps the lock until its
# memory is freed, while its environment already reads empty. A rerun that overlaps it fails.
LOCKED_MEMORY_JOB = ("exec flock -n job.lock {python} -c \"import pathlib, time; b = b'x' * (1536 << 20); "
                     "pathlib.Path('runs').open('a').write('run\\n'); time.sleep(120)\"")


class Host:
    """A worker process on a host of its own: its own hostname and PID namespace (`unshare`, as root),
    so other workers judge it by its heartbeat lease only, as a worker on another machine."""

    def __init__(self, workers, name, db):
        command = f"hostname {name} && exec {shlex.quote(sys.executable)} {shlex.quote(QUEUECTL)} " \
                  f"--db {shlex.quote(db)} worker start"
        self.log_path = workers.folder / f"{name}.stderr"
        with open(self.log_path, "wb") as err:
            # --kill-child: the namespace's first process (the worker) gets SIGKILL if unshare dies
            self.popen = subprocess.Popen(["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child",
                                           "sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=err, env=child_env(**{TAG_VAR: workers.tag}), start_new_session=True)
        workers.others.append(self.popen)
        self.proc = WorkerProc(self.popen, self.log_path)

    def worker_pid(self):
        """The worker's PID as this host sees it (the namespace's PID 1: unshare's child)."""
        return wait_for(lambda: _first_child(self.popen.pid), "the namespace's first process")


def _first_child(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _run_processes(token):
    """PIDs of live processes carrying QUEUECTL_RUN=token (seen from this host's /proc)."""
    needle = f"QUEUECTL_RUN={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0") and not pid_gone(int(name)):
                        found.append(int(name))
    return found


@pytest.fixture
def hosts(pg_url, workers):
    """Start workers on hosts of their own sharing one PostgreSQL queue (root and unshare needed)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        message = "the several-hosts tests need root and unshare (PID and UTS namespaces)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    ok(pg_url, "config", "set", "stale-timeout", "2")
    return lambda name: Host(workers, name, pg_url)


def hold_write_lock(db):
    """Another process that takes the database's write lock and keeps it until its stdin is closed."""
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


OTHER_WRITERS = "anyone who can write it chooses the commands"


def _load_bench():
    """bench/bench.py as a module (it is a script, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("queuectl_bench", os.path.join(HERE, "bench", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TEXT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z queuectl\[\d+\]: (.*)$")


SUMMARIES = {"queuectl_run_duration_seconds"}  # every other family is a gauge


def parsed_families(text):
    """The metric families of text, parsed by prometheus_client's own parser."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus_client is missing; CI must run the metrics parser test (pip install "
                        "prometheus_client)")
        pytest.skip("metrics parser test skipped: pip install prometheus_client")
    return list(text_string_to_metric_families(text))


def prometheus_families(text):
    """sample name -> {frozenset(labels.items()): value}; each family of its declared type."""
    families = {}
    for family in parsed_families(text):
        assert family.type == ("summary" if family.name in SUMMARIES else "gauge") and family.documentation, family
        families.setdefault(family.name, {})
        for s in family.samples:
            families.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return families


def sample(families, name, **labels):
    return families[name][frozenset(labels.items())]


def delay_of(job):
    """Seconds from a job's creation to its due time, from its JSON."""
    return (parse_iso(job["next_run_at"]) - parse_iso(job["created_at"])).total_seconds()


def dead_chain_db(db):
    """root (default) dead; child (q2) depends on root, dead with it; lone (q2) dead; fine (default) completed;
    wait (q3) pending."""
    now = time.time()
    with opened(db) as s:
        register(s, now=now)
        s.enqueue([spec("root", "exit 1", max_retries=0)], now)
        s.enqueue([spec("child", queue="q2", depends_on=["root"])], now)
        finish_next(s, 1, now)
        s.enqueue([spec("lone", "exit 1", max_retries=0, queue="q2")], now)
        finish_next(s, 1, now)
        s.enqueue([spec("fine")], now)
        finish_next(s, 0, now)
        s.enqueue([spec("wait", queue="q3")], now)
    return db


OLDER_REGISTER = ("INSERT INTO workers (id, host, pid, proc_start, boot_id, pid_ns, threads, started_at, heartbeat_at) "
                  "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)")  # what the queuectl before schema 5 registered
# A job as the queuectl before schema 6 (on_dead) enqueued it: this one's statements name columns it lacks.
OLDER_INSERT_JOB = ("INSERT INTO jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at, "
                    "next_run_at, priority, queue, waiting_on, ready) VALUES (?, 'true', 'pending', 3, 0, '/', '{}', "
                    "?, ?, ?, ?, ?, 0, 1)")


def enqueue_older(store, job_id, queue="default", priority=0, now=T0):
    """Enqueue a due job in a database at an older schema, as the queuectl of that schema did."""
    row = (job_id, now, now, now, priority, queue)
    store.write(lambda cur: cur.execute(OLDER_INSERT_JOB.replace("?", store.sql.PARAM), row))


def dump(db):
    """Everything the database holds, definitions and rows, to compare before and after a command that
    must change nothing: SQLite's own dump and header fields, or the PostgreSQL schema's columns,
    constraints, indexes and every table's rows."""
    if not is_pg(db):
        conn = sqlite3.connect(db)
        try:
            return [*conn.execute("SELECT (SELECT user_version FROM pragma_user_version()), "
                                  "(SELECT application_id FROM pragma_application_id())"), *conn.iterdump()]
        finally:
            conn.close()
    import psycopg
    from psycopg import sql as pgsql
    url, schema = db.rsplit("schema=", 1)
    with psycopg.connect(url[:-1], autocommit=True) as conn:
        found = [conn.execute(query, (schema,)).fetchall() for query in (
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY 1, 2",
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE connamespace = %s::regnamespace ORDER BY 1, 2",
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1, 2")]
        for (table,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)):
            rows = conn.execute(pgsql.SQL("SELECT * FROM {}.{}").format(pgsql.Identifier(schema),
                                                                       pgsql.Identifier(table))).fetchall()
            found.append((table, sorted(map(repr, rows))))
        return found


class HangingProxy:
    """A TCP proxy in front of the test's PostgreSQL server that can stop forwarding while it keeps every
    connection open, as a server whose processes are stopped (or a network that drops packets without a
    reset) looks to a client: the kernel still acknowledges, nothing answers."""

    def __init__(self, server_url):
        from urllib.parse import urlsplit
        parts = urlsplit(server_url)
        self.upstream = (parts.hostname, parts.port)
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.closed = False
        self.sockets = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, pg_url):
        """pg_url, through this proxy."""
        from urllib.parse import urlsplit, urlunsplit
        parts = urlsplit(pg_url)
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{self.port}" if "@" in parts.netloc \
            else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def hang(self):
        """Stop forwarding (what was read is held back); connections stay open, new ones are accepted."""
        self.forwarding.clear()

    def resume(self):
        self.forwarding.set()

    def close(self):
        self.closed = True
        self.forwarding.set()
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source, sink):
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                self.forwarding.wait()  # hung: held here, the connection open
                if not data or self.closed:
                    break
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def screen(raw):
    """The non-blank lines a terminal shows after `raw`: CR goes to column 0, ESC [ K erases to the end
    of the line, LF goes one line down (the terminal's own CR LF for a newline comes as both)."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            lines[row], i = lines[row][:col], i + 3
            continue
        ch = raw[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        else:
            line = lines[row].ljust(col)
            lines[row], col = line[:col] + ch + line[col + 1:], col + 1
        i += 1
    return [line for line in lines if line.strip()]


class TerminalRun:
    """The real script with stderr on a pseudo-terminal (stdout to a file, stdin from one, or with
    stdin_path=None from the terminal too, where type() answers): `raw()` is everything it wrote to the
    terminal so far."""

    def __init__(self, folder, db, *args, stdin_path=os.devnull, **env):
        master, slave = pty.openpty()
        self.out_path, self.master, self.chunks = folder / f"stdout.{uuid.uuid4().hex}", master, []
        environ = child_env(TERM="xterm")
        environ.pop("QUEUECTL_NO_PROGRESS", None)
        environ.update(env)
        try:
            with open(stdin_path or os.devnull, "rb") as stdin, open(self.out_path, "wb") as out:
                self.popen = subprocess.Popen([sys.executable, QUEUECTL, "--db", db, *args],
                                              stdin=stdin if stdin_path else slave,
                                              stdout=out, stderr=slave, env=environ,
                                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        finally:
            os.close(slave)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    def raw(self):
        return b"".join(self.chunks).decode("utf-8", "replace")

    def wait_raw(self, fragment):
        wait_for(lambda: fragment in self.raw(), f"{fragment!r} on the terminal; got {self.raw()!r}")

    def type(self, text):
        os.write(self.master, text.encode())

    def finish(self, timeout=WAIT_S):
        """Wait for the exit; return (exit code, stdout, raw terminal output)."""
        code = self.popen.wait(timeout=timeout)
        self.reader.join(timeout)
        os.close(self.master)
        with open(self.out_path) as f:
            return code, f.read(), self.raw()

    def kill(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


@pytest.fixture
def terminal(tmp_path):
    """Factory for TerminalRun on the test's db; whatever still runs is killed at teardown."""
    runs = []

    def start(db, *args, **kw):
        runs.append(TerminalRun(tmp_path, db, *args, **kw))
        return runs[-1]
    yield start
    for run in runs:
        run.kill()


def finish_due(db, code=0):
    """Claim and finish every due job with exit `code`, as a worker would; returns their ids."""
    done = []
    with opened(db) as s:
        register(s, "tw", now=time.time())
        while (job := s.claim("tw", time.time())) is not None:
            s.finish(job, "tw", outcome(code, None if code == 0 else f"exit code {code}", "", 0.0), SETTINGS,
                     time.time())
            done.append(job.id)
        s.deregister("tw")
    return done


UNFINISHED = queuectl.Store.unfinished


def utc(text):
    """'2026-03-29T01:00:00Z' -> Unix seconds."""
    return parse_iso(text).timestamp()


CONFIG_DEFAULTS_INTERNAL = {key: default for key, (default, _) in queuectl.CONFIG.items()}


def add_schedule(store, now=T0, **fields):
    """Validate and store a schedule as `schedule add` would at time `now`; returns it."""
    obj = {"id": "s", "command": "true", "tz": "UTC", **fields}
    schedule = queuectl.validate_schedule(obj, CONFIG_DEFAULTS_INTERNAL, "/", now)
    store.add_schedule(schedule)
    return schedule


SCHEDULE_KEYS = {"id", "cron", "every", "tz", "overlap", "paused", "next_run_at", "last_run_at", "last_job_id",
                 "last_job_state", "job"}


SPAWN_COMMANDS = ["true", "false", "echo one; echo two >&2; exit 4", "env", "cat", "kill -PIPE $$", "kill -TERM $$",
                  "nosuchprogram-qc", "ls /no/such/path", "printf %s \"$PWD\"",
                  "echo $(cut -d' ' -f5,6 /proc/$$/stat) $$", "sh -c 'exit 3'"]


def waiting_for_a_lock(s, pid):
    """Whether the server session `pid` waits for a row lock (a statement blocked on another). By pid:
    other tests' leftover sessions in the same database may be waiting for locks of their own."""
    return s.read("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %s",
                  (pid,))[0][0] > 0


def while_rows_locked(s, ids, act, meanwhile):
    """Run act(store) on a Store of its own while another transaction holds the rows of `ids`; once act
    waits for one of them, meanwhile(other) runs in that transaction, which then commits. Returns act's
    result, or the QueueError it raised."""
    import psycopg
    result = {}

    def run(mine):
        try:
            result["value"] = act(mine)
        except queuectl.QueueError as e:
            result["value"] = e
    with contextlib.closing(queuectl.PostgresStore(s.target)) as mine:
        pid = mine.read("SELECT pg_backend_pid()")[0][0]
        with psycopg.connect(s._libpq) as other:  # commits at the end of the block
            other.execute(f'SET search_path TO "{s.schema}"')
            other.execute("SELECT 1 FROM jobs WHERE id = ANY(%s) FOR UPDATE", (ids,))
            t = threading.Thread(target=run, args=(mine,))
            t.start()
            wait_for(lambda: waiting_for_a_lock(s, pid), "the bulk action to wait for a locked row")
            meanwhile(other)
        t.join(WAIT_S)
    return result["value"]


DONE = queuectl.Outcome(0, None, b"ok\n", 0.01)


HOSTILE_TEXT = ["tab\there", "new\nline", "cr\rhere", "back\\slash", "\\N", "\\.", "ends\\", "\\t\\n literally",
                "ünïcödé ✓ 日本語 🚀", "quotes ' \" `", "line\u2028separator", "del\x7f and \x01 and \x1b[0m"]


needs_glibc = pytest.mark.skipif(queuectl._glibc_spawn() is None, reason="not glibc on Linux")


STREAMED_FAILURES = [  # (lines, exit code, what the one error line names); line 1 is the seeded job "keep"
    # An invalid line wins over an earlier duplicate: every job is validated before the batch is checked.
    ([{"id": "a", "command": "true"}, {"id": "a", "command": "true"}, '{"command": '], 2, ["line 3", "JSON"]),
    ([{"id": "a", "command": "true"}, {"id": "a", "command": "true"}, {"id": "b", "command": "true"}], 2,
     ["line 2", "'a'", "twice"]),
    # The batch's own errors win over an id already taken.
    ([{"id": "keep", "command": "true"}, {"id": "b", "command": "true"}, {"id": "b", "command": "true"}], 2,
     ["line 3", "'b'", "twice"]),
    ([{"id": "a", "command": "true"}, {"id": "keep", "command": "true"}, {"id": "b", "command": "true"}], 1,
     ["line 2", "'keep'", "already exists"]),
    ([{"id": "a", "command": "true"}, {"id": "b", "command": "true", "depends_on": ["c"]},
      {"id": "c", "command": "true"}], 2, ["line 2", "'c'", "earlier"]),
    ([{"id": "a", "command": "true"}, {"id": "b", "command": "true", "depends_on": ["nope"]}], 1,
     ["line 2", "'nope'", "does not exist"]),
]


def _children(pid):
    """The child processes of `pid`, whichever of its threads started them."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(child) for child in f.read().split()]
    return found


_DIES_AFTER_SPAWN = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import queuectl
queuectl.Watchdog.start(f"watchdog-test:{os.getpid()}:{os.urandom(3).hex()}")
real_spawn = queuectl._spawn
def spawn(job, extra, die_with_worker, stdin=None):
    proc = real_spawn(job, extra, die_with_worker, stdin)
    if not die_with_worker:  # the job runs, and its worker dies before it could tell the watchdog of it
        print(proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return proc
queuectl._spawn = spawn
job = queuectl.Job(id="j", command=sys.argv[3], state="processing", attempts=0, max_retries=0, timeout=0.0,
                   cwd=sys.argv[2], env={}, created_at=0.0, updated_at=0.0, next_run_at=0.0, last_error=None,
                   exit_code=None, worker_id="w", run_count=1, lost_count=0, priority=0, queue="default",
                   waiting_on=0)
queuectl.run_command(job, {"QUEUECTL_RUN": sys.argv[4]}, lambda: None, die_with_worker=True)
"""


_REAPER = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the worker's orphans come to us
worker = os.fork()
if worker == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
with open(sys.argv[1], "w") as f:
    f.write(f"{worker}\\n")
while True:  # reap every orphan at once, as systemd or a container's init does
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.01)
"""


def unchanged_everywhere(db):
    """snapshot(db) with the schedules, which a refused `schedule add` must leave as they were too."""
    return snapshot(db), ok(db, "schedule", "list", "--json")


# ESC sequences (clear the screen, turn red), a bare CR and an LF (a forged line), a C1 CSI, a line
# separator and a right-to-left override: what anyone who may enqueue can put into a job.
TERMINAL_HOSTILE = "a\x1b[2J\x1b[31mred\r\nfake line\x9bb\u2028c\u202ed"
TERMINAL_SHOWN = r"a\x1b[2J\x1b[31mred\r\nfake line\x9bb\u2028c\u202ed"
HOSTILE_OUTPUT = "ok\x1b[2K\rstate:        completed\n\tsecond line\n"  # CR back over a line, to rewrite it
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # LF, tab pass


def assert_terminal_safe(text):
    """No character of `text` can move the cursor, recolour or reorder the screen, or start a line of its own."""
    assert not RAW_CONTROL.search(text), repr(text)
    assert not any(line.startswith("fake line") for line in text.split("\n")), text


# ---- PostgreSQL server, for the PostgreSQL backend's tests ---------------------------------------
# One server for the whole session: $QUEUECTL_TEST_PG (a postgresql:// URL with a host; .ci/run sets it),
# else a throwaway cluster this session starts with .ci/postgres and removes at the end. Each test then
# gets its own fresh schema in it (pg_url), dropped at teardown.

PG_HELPER = os.path.join(HERE, ".ci", "postgres")
PG_SKIP = ("PostgreSQL tests need a server: install postgresql and pip install 'psycopg[binary]', "
           "or set QUEUECTL_TEST_PG")


def pg_unavailable(why):
    """Skip a test that needs PostgreSQL; under CI=true fail instead, so CI cannot pass without them."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}; CI must run the PostgreSQL tests ({PG_SKIP})")
    pytest.skip(PG_SKIP)


@pytest.fixture(scope="session")
def pg_server():
    """URL of a PostgreSQL server for the session (see above); skips when there is none, and under
    `make check` (QUEUECTL_TEST_BACKENDS=sqlite), the quick loop that leaves PostgreSQL to `make test`."""
    if os.environ.get("QUEUECTL_TEST_BACKENDS") == "sqlite" and os.environ.get("CI") != "true":
        pytest.skip("make check runs the SQLite tests only; make test runs them all")
    try:
        import psycopg  # noqa: F401  (only the PostgreSQL tests need it)
    except ImportError:
        pg_unavailable("psycopg is not installed")
    url = os.environ.get("QUEUECTL_TEST_PG")
    if url:
        yield url
        return
    if subprocess.run(["bash", PG_HELPER, "bindir"], capture_output=True).returncode != 0:
        pg_unavailable("PostgreSQL (initdb) is not installed")
    folder = tempfile.mkdtemp(prefix="queuectl-pg.", dir="/tmp")  # traversable by the postgres user
    try:
        started = subprocess.run(["bash", PG_HELPER, "start", folder], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, f".ci/postgres start failed:\n{started.stderr}"
        yield started.stdout.strip()
    finally:
        stopped = subprocess.run(["bash", PG_HELPER, "stop", folder], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, f".ci/postgres stop failed:\n{stopped.stderr}"


@pytest.fixture
def pg_url(pg_server):
    """`--db` URL for one test: the session's server with a fresh schema (the backend creates it on
    first use); the schema is dropped with everything in it at teardown."""
    import psycopg
    from psycopg import sql as pgsql
    schema = f"t_{uuid.uuid4().hex}"
    yield f"{pg_server}{'&' if '?' in pg_server else '?'}schema={schema}"
    with psycopg.connect(pg_server, autocommit=True, connect_timeout=30) as conn:
        conn.execute("SET lock_timeout = '30s'")  # a leftover session holding a lock fails loudly
        conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))


class OwnServer:
    """A PostgreSQL cluster of one test (.ci/postgres), which the test may stop and start again on the
    same port, as a server restart or an outage looks to a worker."""

    def __init__(self, folder):
        from urllib.parse import urlsplit
        self.folder = folder
        started = subprocess.run(["bash", PG_HELPER, "start", folder], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, f".ci/postgres start failed:\n{started.stderr}"
        self.server = started.stdout.strip()
        self.url = f"{self.server}?schema=own"
        self.port = urlsplit(self.server).port
        self.bindir = subprocess.run(["bash", PG_HELPER, "bindir"], capture_output=True, text=True).stdout.strip()

    def pg_ctl(self, *args):
        command = [f"{self.bindir}/pg_ctl", "-D", f"{self.folder}/data", *args]
        if os.getuid() == 0:  # as .ci/postgres does: the cluster's owner runs it
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr

    def stop(self):
        self.pg_ctl("stop", "-m", "fast", "-w", "-t", "60")

    def start(self):
        self.pg_ctl("start", "-l", f"{self.folder}/log", "-w", "-t", "60", "-o", f"-p {self.port}")


@pytest.fixture
def own_pg(pg_server):
    """A PostgreSQL server for this test alone (see OwnServer), removed at teardown."""
    if subprocess.run(["bash", PG_HELPER, "bindir"], capture_output=True).returncode != 0:
        pg_unavailable("PostgreSQL (initdb) is not installed")
    folder = tempfile.mkdtemp(prefix="queuectl-own.", dir="/tmp")
    try:
        yield OwnServer(folder)
    finally:
        stopped = subprocess.run(["bash", PG_HELPER, "stop", folder], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, f".ci/postgres stop failed:\n{stopped.stderr}"


def terminate_other_sessions(pg_url):
    """Drop every other client connection to the test server's database (as a proxy or a server
    restart would): returns how many were dropped."""
    import psycopg
    with psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as conn:
        return conn.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' "
                            "AND datname = current_database()").fetchone()[0]


def test_throwaway_postgres_server_answers(pg_server):
    import psycopg
    with psycopg.connect(pg_server, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] in (
            "on", "off", "local", "remote_write", "remote_apply")


# ==== Constants and configuration =================================================================

# ---- config validators and the `config` command --------------------------------------------------

@pytest.mark.parametrize("key,text,expected", [
    ("max_retries", "0", 0), ("max_retries", "5", 5), ("backoff_base", "1", 1.0), ("backoff_base", "2.5", 2.5),
    ("backoff_max", "0", 0.0), ("stale_timeout", "1.5", 1.5), ("job_timeout", "30", 30.0)])
def test_config_validators_accept(key, text, expected):
    assert queuectl.CONFIG[key][1](text) == expected


@pytest.mark.parametrize("key,text", [
    ("max_retries", "-1"), ("max_retries", "1.5"), ("max_retries", "x"), ("backoff_base", "0.99"),
    ("backoff_base", "nan"), ("backoff_max", "-1"), ("backoff_max", "inf"), ("stale_timeout", "0"), ("stale_timeout", "0.5"), ("max_retries", "1_000"),
    ("job_timeout", "-0.1"), ("max_retries", "9" * 5000), ("max_retries", "-" + "9" * 400)])
def test_config_validators_reject(key, text):
    with pytest.raises(queuectl.UsageError):
        queuectl.CONFIG[key][1](text)


def test_config_roundtrip_and_defaults(store):
    assert store.config_get("max_retries") == 3
    store.config_set("max_retries", 7)
    assert store.config_all()["max_retries"] == 7


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
    values = {"max-retries": "0", "backoff-base": "1.5", "backoff-max": "0", "stale-timeout": "1.5",
              "job-timeout": "30", "retention": "2", "output-limit": "2048", "kill-grace": "2.5"}
    for key, value in values.items():
        ok(db, "config", "set", key, value)
    ok(db, "config", "set", "on-dead", "echo $QUEUECTL_DEAD_JOB_ID | mail ops")
    stored = json.loads(ok(db, "config", "list", "--json"))
    assert stored == {**{key: float(value) for key, value in values.items()},
                      "on-dead": "echo $QUEUECTL_DEAD_JOB_ID | mail ops"}
    assert ok(db, "config", "get", "on-dead") == "echo $QUEUECTL_DEAD_JOB_ID | mail ops\n"
    ok(db, "config", "set", "retention", "12h")
    assert ok(db, "config", "get", "retention") == "43200\n"
    assert isinstance(stored["max-retries"], int)
    assert float(ok(db, "config", "get", "backoff_base")) == 1.5
    assert "backoff-base = 1.5" in ok(db, "config", "list")


@sqlite_only
@pytest.mark.parametrize("key, value", [
    ("max-retries", "-1"), ("max-retries", "1.5"), ("max-retries", "abc"), ("max-retries", ""),
    ("max-retries", "nan"), ("backoff-base", "0.5"), ("backoff-base", "0"), ("backoff-base", "nan"),
    ("backoff-base", "abc"), ("backoff-max", "-1"), ("backoff-max", "nan"), ("stale-timeout", "0"),
    ("stale-timeout", "-3"), ("stale-timeout", "nan"), ("stale-timeout", "abc"),
    ("job-timeout", "-1"), ("job-timeout", "nan"), ("job-timeout", "abc"), ("max_retries", "-1"),
    ("retention", "-1d"), ("retention", "--7d"),  # option-like: still named as the bad value
])
def test_config_set_rejects_bad_values(seeded_db, key, value):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", key, value)
    assert (code, out) == (2, ""), err
    assert_one_error(err, value)
    assert snapshot(seeded_db) == before


@sqlite_only
@pytest.mark.parametrize("values", [[], ["1", "2"]])
def test_config_set_takes_exactly_one_value(seeded_db, values):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", "max-retries", *values)
    assert (code, out) == (2, ""), err
    assert_one_error(err, "exactly one value", f"got {len(values)}")
    assert snapshot(seeded_db) == before

@sqlite_only
@pytest.mark.parametrize("args", [("set", "bogus", "1"), ("get", "bogus"), ("set", "xyz-wq", "1")])
def test_config_unknown_key_lists_the_valid_keys(seeded_db, args):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", *args)
    assert (code, out) == (2, "")
    assert_one_error(err, args[1], *CONFIG_KEYS)
    assert snapshot(seeded_db) == before


@sqlite_only
@pytest.mark.parametrize("args", [("get", "MAX-RETRIES"), ("set", "Max_Retries", "5")])
def test_config_key_in_capitals_gets_the_key_suggested(db, args):
    code, out, err = cli(db, "config", *args)
    assert (code, out) == (2, "")
    assert_one_error(err, f"unknown config key {args[1]!r} (did you mean 'max-retries'?)")
    assert not os.path.exists(db)


def test_config_set_help_names_the_keys_and_their_formats():
    code, out, _ = run_main(["config", "set", "--help"])
    assert code == 0
    for text in ("output-limit", "retention", "15m", "1w", "64K"):
        assert text in " ".join(out.split()), text


# ---- durations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800),
                                           ("90", 90), ("1w", 604800), (90, 90), (1.5, 1.5), ("1.5h", 5400),
                                           ("0", 0), (" 2m ", 120)])
def test_parse_duration(text, seconds):
    assert queuectl.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1y", "1W", "\u0663h", "-1h", "1 h", "1e3", "1.h", "99999d", "nan", "1h30m",
                                  True, None, -1, 10**12])
def test_parse_duration_rejects(text):
    with pytest.raises(queuectl.UsageError):
        queuectl.parse_duration(text)


def test_sizes_read_as_people_write_them():
    assert [queuectl.size_text(n) for n in (0, 1023, 1024, 1536, 65536, 14_889_779, 2**20 - 20, 3 * 2**30)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "64 KiB", "14.2 MiB", "1 MiB", "3 GiB"]


@pytest.mark.parametrize("key,text,stored", [
    ("backoff-max", "2h", 7200), ("stale-timeout", "1m", 60), ("job-timeout", "90s", 90), ("retention", "1w", 604800),
    ("job-timeout", "1.5", 1.5), ("stale-timeout", "1d", 86400)])
def test_config_keys_in_seconds_take_durations_and_print_seconds(db, key, text, stored):
    ok(db, "config", "set", key, text)
    assert ok(db, "config", "get", key) == f"{stored}\n"
    assert json.loads(ok(db, "config", "list", "--json"))[key] == stored


@sqlite_only
@pytest.mark.parametrize("key,text", [("job-timeout", "5x"), ("stale-timeout", "2d"), ("retention", "1y"),
                                      ("backoff-max", "-1m"), ("stale-timeout", "0s")])
def test_config_bad_duration_exits_2_naming_the_value(seeded_db, key, text):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", key, text)
    assert (code, out) == (2, "")
    assert_one_error(err, key, repr(text))
    assert snapshot(seeded_db) == before


def test_job_delay_and_timeout_take_durations_and_show_seconds(db):
    job = enqueue(db, id="d", command="true", delay="15m", timeout="2h")
    assert job["timeout"] == 7200
    assert delay_of(job) == pytest.approx(900, abs=0.01)
    week = enqueue(db, id="w", command="true", delay="1w", timeout=90)
    assert delay_of(week) == pytest.approx(604800, abs=0.01)
    assert week["timeout"] == 90


@sqlite_only
@pytest.mark.parametrize("field,value", [("delay", "5x"), ("timeout", "1y"), ("delay", "-5m"), ("timeout", "15 m"),
                                         ("delay", True), ("timeout", "99999d")])
def test_job_bad_duration_exits_2_naming_field_and_value(seeded_db, field, value):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", json.dumps({"command": "true", field: value}))
    assert (code, out) == (2, "")
    assert_one_error(err, f"field '{field}'", repr(value))
    assert snapshot(seeded_db) == before


@sqlite_only
def test_duration_flags_take_units_and_name_a_bad_value(db):
    enqueue(db, id="done", command="true")
    with opened(db) as s:
        register(s, now=time.time())
        finish_next(s, 0, time.time())
    assert ok(db, "wait", "done", "--timeout", "1m") == ""
    assert json.loads(ok(db, "stats", "--since", "1w", "--json"))["window_s"] == 604800
    assert ok(db, "purge", "--older-than", "1w") == "purged 0 completed jobs\n"
    for args in (("wait", "done", "--timeout", "5x"), ("worker", "stop", "--wait", "--timeout", "1y"),
                 ("purge", "--older-than", "2 d"), ("add", "--timeout", "3q", "--", "true")):
        code, out, err = cli(db, *args)
        assert (code, out) == (2, ""), args
        assert f"'{args[-1] if args[0] != 'add' else '3q'}'" in err and "Traceback" not in err, err


# ---- numbers: one grammar for config, flags, arguments and job fields ----------------------------
# Every number goes through parse_number (or parse_duration): ASCII digits, an optional '-', a
# '.fraction' where fractions are allowed, blanks around ignored; not what int() and float() also take
# ("３" fullwidth, "٣" Arabic-Indic, "1_000", "+5", "1e3", "nan").

@pytest.mark.parametrize("text", ["１０２４", "٢٠٤٨", "2\u200b048"])
def test_output_limit_takes_ascii_digits_only_as_durations_do(text):
    with pytest.raises(queuectl.UsageError, match="not a size"):
        queuectl.parse_size(text)


@pytest.mark.parametrize("text,value", [("1767225600", 1767225600.0), ("1.5", 1.5),
                                        ("2026-12-01T02:00:00", "2026-12-01T02:00:00"), ("١٢", "١٢")])
def test_a_command_line_time_is_unix_seconds_only_in_ascii_digits(text, value):
    assert queuectl.cli_time(text) == value


@pytest.mark.parametrize("key,value", [
    *(("max-retries", v) for v in ("３", "٣", "+5", " ５ ")),
    *(("backoff-base", v) for v in ("３", "٣", "+5", " ５ ", "1e1"))])
def test_config_numbers_take_ascii_digits_only_as_durations_do(seeded_db, key, value):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", key, value)
    assert (code, out) == (2, ""), err
    assert_one_error(err, f"config {key}", repr(value))
    assert snapshot(seeded_db) == before


@pytest.mark.parametrize("argv", [
    ("list", "--limit", "３"), ("list", "--limit", "1_0"), ("logs", "keep", "--run", "١"),
    ("add", "--priority", "３", "--", "true"), ("add", "--priority", "+5", "--", "true"),
    ("add", "--max-retries", "1_0", "--", "true"), ("schedule", "next", "nightly", "--count", "３"),
])
def test_flags_and_arguments_take_the_same_numbers_as_config(seeded_db, argv):
    ok(seeded_db, "schedule", "add", '{"id": "nightly", "cron": "0 3 * * *", "tz": "UTC", "command": "true"}')
    before = unchanged_everywhere(seeded_db)
    code, out, err = cli(seeded_db, *argv)
    assert (code, out) == (2, ""), err
    assert_one_error(err, repr(argv[argv.index("--") - 1] if "--" in argv else argv[-1]))
    assert unchanged_everywhere(seeded_db) == before


@pytest.mark.parametrize("argv", [("worker", "start", "--count", "３"), ("dashboard", "--port", "８０８０")])
def test_the_long_running_commands_refuse_a_fullwidth_count_or_port(argv):
    """Parsed only: before the fix these would have started a worker or a dashboard."""
    with pytest.raises(queuectl.UsageError, match=re.escape(repr(argv[-1]))):
        queuectl.build_parser().parse_args(list(argv))


def test_blanks_around_a_number_are_ignored_wherever_a_number_is_read(db):
    """A duration and a config number took " 3"; a queue limit refused it."""
    ok(db, "limit", "images", " 3")
    ok(db, "config", "set", "max-retries", " 5 ")
    ok(db, "config", "set", "job-timeout", " 5m ")
    assert json.loads(ok(db, "limit", "--json")) == {"images": 3}
    assert json.loads(ok(db, "config", "list", "--json"))["max-retries"] == 5


@pytest.mark.parametrize("key,value", [("stale_timeout", "5\u3000"), ("output_limit", "\u30001K"),
                                       ("max_retries", "5\u3000")])
def test_only_ascii_blanks_are_ignored_around_a_number(key, value):
    """str.strip() also strips an ideographic space; the grammar's blanks are ASCII, as its digits."""
    with pytest.raises(queuectl.UsageError):
        queuectl.CONFIG[key][1](value)


@pytest.mark.parametrize("key,value,rule", [
    ("backoff-base", "1000.0000001", "from 1 to 1000"), ("backoff-base", "0.9999999", "from 1 to 1000"),
    ("max-retries", "1000001", "from 0 to 1000000"), ("output-limit", "65M", "67108864")])
def test_a_config_range_error_shows_the_value_as_given(db, key, value, rule):
    """`value 1000 must be from 1 to 1000` (the value rounded by :g) read as a contradiction."""
    before = snapshot(db)
    code, out, err = cli(db, "config", "set", key, value)
    assert (code, out) == (2, ""), err
    assert_one_error(err, f"config {key}", repr(value), rule)
    assert snapshot(db) == before


@pytest.mark.parametrize("fields,named", [
    ({"priority": 5_000_000}, "5000000"), ({"max_retries": -1}, "-1"), ({"run_at": 1e300}, "1e+300"),
    ({"priority": "5"}, "'5'")])
def test_a_job_field_range_error_names_the_value(db, fields, named):
    before = snapshot(db)
    code, out, err = cli(db, "enqueue", json.dumps({"command": "true", **fields}))
    assert (code, out) == (2, ""), err
    assert_one_error(err, f"field {next(iter(fields))!r}", named)
    assert snapshot(db) == before


def test_a_huge_number_anywhere_is_a_short_one_line_error(db):
    before = snapshot(db)
    for argv in (("config", "set", "max-retries", "9" * 5000), ("list", "--limit", "9" * 5000),
                 ("add", "--priority", "9" * 5000, "--", "true"), ("limit", "images", "9" * 5000)):
        code, out, err = cli(db, *argv)
        assert (code, out) == (2, ""), err[-300:]
        assert_one_error(err, "5000 characters")
        assert len(err) < 300
    assert snapshot(db) == before


def test_pgport_takes_the_same_integers(monkeypatch):
    monkeypatch.setenv("PGPORT", "５４３２")
    with pytest.raises(queuectl.UsageError, match="PGPORT"):
        queuectl._pg_target("postgresql://u@127.0.0.1/d")
    monkeypatch.setenv("PGPORT", "5433")
    assert queuectl._pg_target("postgresql://u@127.0.0.1/d")[2] == "127.0.0.1:5433"


# ==== Model =======================================================================================

def test_iso_is_utc_with_z():
    assert queuectl.iso(0) == "1970-01-01T00:00:00.000Z"
    assert queuectl.iso(None) is None


# ==== Rules and validation ========================================================================

@pytest.mark.parametrize("attempts,base,cap,expected", [
    (1, 2, 3600, 2), (2, 2, 3600, 4), (3, 2, 5, 5), (10**6, 2, 3600, 3600), (5, 1, 3600, 1), (3, 2, 0, 0)])
def test_backoff_delay(attempts, base, cap, expected):
    assert queuectl.backoff_delay(attempts, base, cap) == expected


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


@sqlite_only
def test_an_empty_cwd_is_refused_as_not_absolute_not_as_a_vanished_current_folder(db):
    """`"cwd": ""` is a field the user gave: the error names the rule it breaks (an absolute path), not
    the current folder, which exists."""
    code, _, err = cli(db, "enqueue", '{"command": "true", "cwd": ""}')
    assert code == 2
    assert_one_error(err, "field 'cwd' must be an absolute path")


def test_an_env_string_the_system_would_refuse_is_refused_at_enqueue(db):
    """The kernel takes at most 131,071 bytes in one NAME=VALUE string: a longer one was stored and then
    failed every attempt with "Argument list too long". It is refused at enqueue (exit 2, nothing
    stored); one at the limit runs."""
    before = snapshot(db)
    fits = "x" * (queuectl.MAX_COMMAND_BYTES - len("BIG="))
    code, _, err = cli(db, "enqueue", "-", stdin=json.dumps({"command": "true", "env": {"BIG": fits + "x"}}))
    assert code == 2
    assert_one_error(err, "env 'BIG'", str(queuectl.MAX_COMMAND_BYTES))
    many = {f"V{i}": "x" * 100_000 for i in range(11)}  # each fits, together more than MAX_ENV_BYTES
    code, _, err = cli(db, "enqueue", "-", stdin=json.dumps({"command": "true", "env": many}))
    assert code == 2
    assert_one_error(err, "field 'env'", str(queuectl.MAX_ENV_BYTES))
    # The kernel also counts each string's NUL and pointer: 100,000 empty variables (800,000 bytes of
    # text) take 1,700,000 bytes of its room, and would fail every attempt.
    empty = {f"A{i:06d}": "" for i in range(100_000)}
    code, _, err = cli(db, "enqueue", "-", stdin=json.dumps({"command": "true", "env": empty}))
    assert code == 2
    assert_one_error(err, "field 'env'", "NUL and pointer")
    assert snapshot(db) == before
    code, _, err = cli(db, "enqueue", "-", stdin=json.dumps({"id": "fits", "command": "true", "env": {"BIG": fits}}))
    assert code == 0, err
    assert ok(db, "worker", "start", "--burst") == ""
    assert state_of(db, "fits") == "completed"


# ---- scheduling fields: priority, run_at, delay, queue, depends_on -------------------------------

def scheduled(**fields):
    return queuectl.validate_job({"command": "ls", **fields}, DEFAULTS, "/tmp", T0)


def test_validate_job_scheduling_defaults():
    job = scheduled()
    assert (job["priority"], job["queue"], job["run_at"], job["depends_on"]) == (0, "default", None, [])


@pytest.mark.parametrize("run_at, expected", [
    ("2030-01-01T12:00:00Z", Y2030),
    ("2030-01-01T12:00:00.250Z", Y2030 + 0.25),
    ("2030-01-01T12:00:00+02:00", Y2030 - 7200),
    ("2030-01-01T12:00:00-01:30", Y2030 + 5400),
    (Y2030, Y2030),
    (int(Y2030), Y2030),
    (0, 0.0),
], ids=["Z", "Z-fraction", "plus-offset", "minus-offset", "epoch-float", "epoch-int", "epoch-0"])
def test_validate_job_run_at_forms(run_at, expected):
    assert scheduled(run_at=run_at)["run_at"] == expected


def test_validate_job_run_at_without_offset_is_local_time(local_tz):
    local_tz("EST5")  # UTC-5 all year
    assert scheduled(run_at="2030-01-01T12:00:00")["run_at"] == Y2030 + 5 * 3600
    local_tz("JST-9")  # UTC+9
    assert scheduled(run_at="2030-01-01T12:00:00")["run_at"] == Y2030 - 9 * 3600
    assert scheduled(run_at="2030-01-01T12:00:00Z")["run_at"] == Y2030  # an explicit Z is not local


def test_a_local_time_on_the_last_day_east_of_utc_is_in_range(local_tz):
    # 9999-12-31T23:59:59 in Tokyo is 14:59:59 UTC, within queuectl's time limit; west of UTC it is past it.
    local_tz("Asia/Tokyo")  # UTC+9
    assert scheduled(run_at="9999-12-31T23:59:59")["run_at"] == queuectl.MAX_UNIX_TIME - 9 * 3600
    assert queuectl.parse_time("9999-12-31T15:00:00", "--after") == queuectl.MAX_UNIX_TIME - 9 * 3600 - 32399
    local_tz("America/New_York")
    with pytest.raises(queuectl.UsageError, match="out of range"):
        scheduled(run_at="9999-12-31T23:59:59")


def test_validate_job_delay_is_relative_to_now():
    assert scheduled(delay=30)["run_at"] == T0 + 30
    assert scheduled(delay=0.5)["run_at"] == T0 + 0.5
    assert scheduled(delay=0)["run_at"] == T0


def test_validate_job_run_at_and_delay_together_is_an_error():
    with pytest.raises(queuectl.UsageError, match="run_at.*delay|delay.*run_at"):
        scheduled(run_at=Y2030, delay=5)


def test_validate_job_queue_names_and_depends_on():
    assert scheduled(queue="A-z_0.9")["queue"] == "A-z_0.9"
    assert scheduled(queue="q" * 64)["queue"] == "q" * 64
    for bad in ("q" * 65, "", "a b", "a/b", "é", 5):
        with pytest.raises(queuectl.UsageError, match="queue"):
            scheduled(queue=bad)
    assert scheduled(depends_on=["a", "b", "a"])["depends_on"] == ["a", "b"]
    assert scheduled(priority=-7)["priority"] == -7


# ==== Schedules ===================================================================================

# ---- cron and every: slots against known calendars -----------------------------------------------

def cron_slots(expr, tz, after, count=6):
    """The next `count` slots of a cron expression in a zone after a UTC time, as slot texts."""
    cron, zone, at, found = queuectl.parse_cron(expr), queuectl.zone_of(tz), utc(after), []
    for _ in range(count):
        at = queuectl.next_cron_slot(cron, zone, at)
        found.append(queuectl.slot_text(at))
    return found


def brute_force_slots(expr, tz, start, end):
    """The slots in (start, end] found minute by minute from the DST rules themselves, independently of
    wall_instant: a minute fires if its wall time matches and is the first occurrence of that wall
    time, or if it is the first minute after a jump forward over a wall time that matches."""
    cron, zone = queuectl.parse_cron(expr), queuectl.zone_of(tz)

    def matches(wall):
        return (wall.minute in cron.minutes and wall.hour in cron.hours and wall.month in cron.months
                and queuectl.cron_day_matches(cron, wall.date()))
    from datetime import timedelta
    found, at = [], start - start % 60 + 60
    while at <= end:
        here = datetime.fromtimestamp(at, zone)
        wall, before = here.replace(tzinfo=None), datetime.fromtimestamp(at - 60, zone).replace(tzinfo=None)
        skipped, step = [], before + timedelta(minutes=1)
        while step < wall:  # wall times the clock jumped over
            skipped.append(step)
            step += timedelta(minutes=1)
        if (matches(wall) and here.fold == 0) or any(matches(w) for w in skipped):
            found.append(at)
        at += 60
    return found


@pytest.mark.parametrize("expr,field,values", [
    ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
    ("1-10/3 * * * *", "minutes", (1, 4, 7, 10)),
    ("5/20 * * * *", "minutes", (5, 25, 45)),
    ("0,30,15 * * * *", "minutes", (0, 15, 30)),
    ("0 9-17/4 * * *", "hours", (9, 13, 17)),
    ("0 0 * jan-mar/2,DEC *", "months", (1, 3, 12)),
    ("0 0 * * mon-fri", "weekdays", (1, 2, 3, 4, 5)),
    ("0 0 * * 7", "weekdays", (0,)),
    ("0 0 * * 0,7", "weekdays", (0,)),
    ("0 0 * * 5-7", "weekdays", (0, 5, 6)),
    ("0 0 * * */2", "weekdays", (0, 2, 4, 6)),
    ("0 0 1-31/10 * *", "days", (1, 11, 21, 31)),
])
def test_cron_fields_parse_lists_ranges_steps_and_names(expr, field, values):
    assert getattr(queuectl.parse_cron(expr), field) == values


@pytest.mark.parametrize("alias,same_as", [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@weekly", "0 0 * * 0"),
    ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@DAILY", "0 0 * * *")])
def test_cron_aliases(alias, same_as):
    assert queuectl.parse_cron(alias) == queuectl.parse_cron(same_as)


@pytest.mark.parametrize("expr,named", [
    ("60 * * * *", "minute '60'"), ("* 24 * * *", "hour '24'"), ("* * 0 * *", "day of month '0'"),
    ("* * 32 * *", "day of month '32'"), ("* * * 13 *", "month '13'"), ("* * * * 8", "day of week '8'"),
    ("* * * foo *", "month 'foo'"), ("* * * * monday", "day of week 'monday'"), ("*/0 * * * *", "minute step '0'"),
    ("5-1 * * * *", "runs backwards"), ("fri-mon * * * *", "minute 'fri'"), ("0 0 * * fri-mon", "runs backwards"),
    ("1- * * * *", "minute ''"), ("1,,2 * * * *", "minute ''"), ("* * * *", "expected 5 fields"),
    ("* * * * * *", "got 6"), ("", "got 0"), ("@reboot", "unknown alias"), ("-1 * * * *", "minute ''"),
    ("١ * * * *", "minute '١'"), ("*/x * * * *", "minute step 'x'")])
def test_cron_rejects_bad_expressions_naming_the_bad_part(expr, named):
    with pytest.raises(queuectl.UsageError, match="cron") as error:
        queuectl.parse_cron(expr)
    assert named in str(error.value)


def test_cron_month_ends_skip_the_months_without_that_day():
    assert cron_slots("0 0 31 * *", "UTC", "2026-01-01T00:00:00Z", 7) == [
        "2026-01-31T00:00:00Z", "2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z",
        "2026-08-31T00:00:00Z", "2026-10-31T00:00:00Z", "2026-12-31T00:00:00Z"]
    assert cron_slots("0 0 30 * *", "UTC", "2027-01-30T00:00:00Z", 2) == [
        "2027-03-30T00:00:00Z", "2027-04-30T00:00:00Z"]
    assert cron_slots("59 23 28-31 2 *", "UTC", "2026-12-31T00:00:00Z", 3) == [
        "2027-02-28T23:59:00Z", "2028-02-28T23:59:00Z", "2028-02-29T23:59:00Z"]


def test_cron_leap_days_follow_the_gregorian_rules():
    assert cron_slots("0 12 29 2 *", "UTC", "2026-03-01T00:00:00Z", 3) == [
        "2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z", "2036-02-29T12:00:00Z"]
    # 2100 is not a leap year (divisible by 100), 2000 and 2400 are (divisible by 400)
    assert cron_slots("0 12 29 2 *", "UTC", "2096-03-01T00:00:00Z", 1) == ["2104-02-29T12:00:00Z"]
    assert cron_slots("0 12 29 2 *", "UTC", "1999-01-01T00:00:00Z", 1) == ["2000-02-29T12:00:00Z"]


def test_cron_never_firing_expression_has_no_slot():
    for expr in ("0 0 30 2 *", "0 0 31 4,6,9,11 *"):
        assert queuectl.next_cron_slot(queuectl.parse_cron(expr), queuectl.zone_of("UTC"), T0) is None


def test_cron_both_day_fields_restricted_fire_on_either():
    # Friday the 13th written as cron is "every 13th, and every Friday"
    assert cron_slots("0 12 13 * fri", "UTC", "2026-01-01T00:00:00Z", 5) == [
        "2026-01-02T12:00:00Z", "2026-01-09T12:00:00Z", "2026-01-13T12:00:00Z", "2026-01-16T12:00:00Z",
        "2026-01-23T12:00:00Z"]
    assert cron_slots("0 0 1,15 * mon", "UTC", "2026-06-01T00:00:00Z", 4) == [
        "2026-06-08T00:00:00Z", "2026-06-15T00:00:00Z", "2026-06-22T00:00:00Z", "2026-06-29T00:00:00Z"]


def test_cron_a_day_field_starting_with_a_star_is_unrestricted_as_in_vixie_cron():
    # dom */2 starts with '*': only days matching both fire (odd days that are Mondays), as cronie does
    assert cron_slots("0 0 */2 * mon", "UTC", "2026-06-01T00:00:00Z", 3) == [
        "2026-06-15T00:00:00Z", "2026-06-29T00:00:00Z", "2026-07-13T00:00:00Z"]
    # the same days written without the star are restricted: odd days or Mondays
    assert cron_slots("0 0 1-31/2 * mon", "UTC", "2026-06-01T00:00:00Z", 3) == [
        "2026-06-03T00:00:00Z", "2026-06-05T00:00:00Z", "2026-06-07T00:00:00Z"]


def test_cron_sunday_is_0_and_7():
    sundays = ["2026-12-06T00:00:00Z", "2026-12-13T00:00:00Z", "2026-12-20T00:00:00Z"]
    for expr in ("0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "@weekly"):
        assert cron_slots(expr, "UTC", "2026-12-01T00:00:00Z", 3) == sundays


def test_cron_names_and_steps_in_a_calendar():
    # 09:30 on weekdays in January, March and May
    assert cron_slots("30 9 * jan-may/2 mon-fri", "UTC", "2026-01-29T12:00:00Z", 3) == [
        "2026-01-30T09:30:00Z", "2026-03-02T09:30:00Z", "2026-03-03T09:30:00Z"]
    assert cron_slots("@monthly", "UTC", "2026-11-15T00:00:00Z", 2) == ["2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"]
    assert cron_slots("@yearly", "UTC", "2026-11-15T00:00:00Z", 1) == ["2027-01-01T00:00:00Z"]
    assert cron_slots("@hourly", "UTC", "2026-11-15T10:00:00Z", 2) == ["2026-11-15T11:00:00Z", "2026-11-15T12:00:00Z"]


def test_cron_reads_wall_time_in_its_zone():
    # 02:30 in Berlin: CET (+1) in winter, CEST (+2) in summer
    assert cron_slots("30 2 * * *", "Europe/Berlin", "2026-01-10T12:00:00Z", 1) == ["2026-01-11T01:30:00Z"]
    assert cron_slots("30 2 * * *", "Europe/Berlin", "2026-07-10T12:00:00Z", 1) == ["2026-07-11T00:30:00Z"]


def test_cron_spring_forward_fires_a_skipped_wall_time_at_the_first_minute_after_it():
    # Berlin 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00Z); 02:30 does not exist that day
    assert cron_slots("30 2 * * *", "Europe/Berlin", "2026-03-27T00:00:00Z", 4) == [
        "2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    # every skipped quarter of an hour lands on 03:00, which is one slot
    assert cron_slots("*/15 * * * *", "Europe/Berlin", "2026-03-29T00:40:00Z", 3) == [
        "2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"]
    # New York 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00Z)
    assert cron_slots("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3) == [
        "2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]


def test_cron_fall_back_fires_a_repeated_wall_time_once_at_its_first_occurrence():
    # Berlin 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00Z); 02:00-02:59 happen twice
    assert cron_slots("*/15 * * * *", "Europe/Berlin", "2026-10-24T23:50:00Z", 6) == [
        "2026-10-25T00:00:00Z", "2026-10-25T00:15:00Z", "2026-10-25T00:30:00Z", "2026-10-25T00:45:00Z",
        "2026-10-25T02:00:00Z", "2026-10-25T02:15:00Z"]
    # asked from inside the second pass of the hour, the next slot is after it
    assert cron_slots("30 2 * * *", "Europe/Berlin", "2026-10-25T01:10:00Z", 1) == ["2026-10-26T01:30:00Z"]
    # New York 2026-11-01: 02:00 EDT becomes 01:00 EST (06:00Z); 01:30 fires at 01:30 EDT only
    assert cron_slots("30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z", 3) == [
        "2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_every_slots_count_from_the_add_rounded_down_to_the_second():
    assert queuectl.next_every_slot(1000, 60, 1000) == 1060
    assert queuectl.next_every_slot(1000, 60, 1059.9) == 1060
    assert queuectl.next_every_slot(1000, 60, 1060) == 1120
    assert queuectl.next_every_slot(1000, 60, 500) == 1060  # the first slot is one interval after the add
    schedule = queuectl.validate_schedule({"id": "s", "every": "15m", "command": "true"}, CONFIG_DEFAULTS_INTERNAL,
                                          "/", T0 + 0.7)
    assert schedule.next_run_at == T0 + 900
    assert queuectl.next_slot(schedule, T0 + 900) == T0 + 1800


@pytest.mark.parametrize("text,seconds", [
    ("30s", 30), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1w", 604800), ("90", 90), (45, 45), ("1s", 1)])
def test_every_durations(text, seconds):
    assert queuectl.parse_every(text) == seconds


@pytest.mark.parametrize("value", ["0s", 0, "1.5m", "-1", "5x", "", True, 2.0, "1 m", "٣s", None, "99999999999w"])
def test_every_rejects_what_is_not_a_whole_duration_of_at_least_a_second(value):
    with pytest.raises(queuectl.UsageError, match="every"):
        queuectl.parse_every(value)


def test_last_slot_finds_the_latest_missed_slot_in_few_steps():
    cron, zone = queuectl.parse_cron("* * * * *"), queuectl.zone_of("UTC")
    calls = []

    def following(t):
        calls.append(t)
        return queuectl.next_cron_slot(cron, zone, t)
    first = utc("2025-01-01T00:00:00Z")
    assert queuectl.last_slot(following, first, utc("2026-01-01T10:20:30Z")) == utc("2026-01-01T10:20:00Z")
    assert len(calls) < 100  # a year of minutely slots, found by halving
    assert queuectl.last_slot(following, first, first + 30) == first
    sparse = queuectl.parse_cron("0 12 29 2 *")
    assert queuectl.last_slot(lambda t: queuectl.next_cron_slot(sparse, zone, t), utc("2028-02-29T12:00:00Z"),
                              utc("2037-01-01T00:00:00Z")) == utc("2036-02-29T12:00:00Z")


@pytest.mark.parametrize("tz,around", [
    ("Europe/Berlin", "2026-03-29T01:00:00Z"), ("Europe/Berlin", "2026-10-25T01:00:00Z"),
    ("America/New_York", "2026-03-08T07:00:00Z"), ("America/New_York", "2026-11-01T06:00:00Z"),
    ("Australia/Lord_Howe", "2026-04-04T15:00:00Z"), ("Australia/Lord_Howe", "2026-10-03T15:30:00Z"),  # 30 min
    ("America/Sao_Paulo", "2018-11-04T03:00:00Z"), ("America/Sao_Paulo", "2019-02-17T02:00:00Z"),  # at midnight
    ("Pacific/Apia", "2011-12-30T10:00:00Z"),  # a whole day skipped
])
def test_cron_slots_around_dst_transitions_equal_a_minute_by_minute_reference(tz, around):
    start, end = utc(around) - 86400, utc(around) + 86400
    for expr in ("*/15 * * * *", "30 2 * * *", "0 0 * * *", "45 1 * * *", "*/7 1-3 * * *", "0,30 23 * * *"):
        cron, zone, at, slots = queuectl.parse_cron(expr), queuectl.zone_of(tz), start, []
        while (at := queuectl.next_cron_slot(cron, zone, at)) <= end:
            slots.append(at)
        assert slots == brute_force_slots(expr, tz, start, end), (expr, tz)


def test_cron_slots_run_through_the_last_year_queuectl_stores(db):
    # The time limit is 9999-12-31T23:59:59Z: year 9999 has slots up to its last hour, and none after.
    ok(db, "schedule", "add", '{"id": "h", "cron": "0 * * * *", "tz": "UTC", "command": "true"}')
    assert ok(db, "schedule", "next", "h", "--after", "9998-12-31T22:30:00Z").split() == [
        "9998-12-31T23:00:00Z", "9999-01-01T00:00:00Z", "9999-01-01T01:00:00Z", "9999-01-01T02:00:00Z",
        "9999-01-01T03:00:00Z"]
    assert ok(db, "schedule", "next", "h", "--after", "9999-06-01T00:00:00Z", "--count", "2").split() == [
        "9999-06-01T01:00:00Z", "9999-06-01T02:00:00Z"]
    assert ok(db, "schedule", "next", "h", "--after", "9999-12-31T21:30:00Z").split() == [
        "9999-12-31T22:00:00Z", "9999-12-31T23:00:00Z"]
    for after in ("9999-12-31T23:00:00Z", str(queuectl.MAX_UNIX_TIME)):
        assert ok(db, "schedule", "next", "h", "--after", after) == ""
    # West of UTC the calendar's last wall times lie past the limit: the slots stop at it, quietly.
    ok(db, "schedule", "add", '{"id": "ny", "cron": "0 * * * *", "tz": "America/New_York", "command": "true"}')
    assert ok(db, "schedule", "next", "ny", "--after", "9999-12-31T21:30:00Z").split() == [
        "9999-12-31T22:00:00Z", "9999-12-31T23:00:00Z"]


def test_a_huge_cron_number_is_a_one_line_error_not_a_traceback(db):
    """int() of more than 4,300 digits raises ValueError: the cron field let it escape main()."""
    before = unchanged_everywhere(db)
    for cron in ("9" * 5000 + " * * * *", "*/" + "9" * 5000 + " * * * *"):
        code, out, err = cli(db, "schedule", "add", json.dumps({"id": "s", "cron": cron, "command": "true"}))
        assert (code, out) == (2, ""), err[-300:]
        assert_one_error(err, "minute", "5000 characters")
        assert len(err) < 300  # the value's start and its length, not 5,000 digits
    assert unchanged_everywhere(db) == before


# ---- firing with an injected time, on both backends ----------------------------------------------

def slot_job_ids(store):
    return [job.id for job in store.list_jobs()]


def test_firing_makes_one_job_per_slot_with_the_slot_in_its_id(store):
    add_schedule(store, now=utc("2026-12-01T01:59:10Z"), cron="0 2 * * *", env={"A": "1"}, queue="nightly",
                 priority=5, max_retries=7)
    assert store.next_schedule_at() == utc("2026-12-01T02:00:00Z")
    assert store.fire_schedules(utc("2026-12-01T01:59:59Z")) == []
    events = store.fire_schedules(utc("2026-12-01T02:00:00.4Z"))
    assert events == [("s", utc("2026-12-01T02:00:00Z"), "s@2026-12-01T02:00:00Z",
                       "job s@2026-12-01T02:00:00Z enqueued")]
    job = store.get("s@2026-12-01T02:00:00Z")
    assert (job.command, job.env, job.queue, job.priority, job.max_retries, job.state) == (
        "true", {"A": "1"}, "nightly", 5, 7, "pending")
    assert job.next_run_at == utc("2026-12-01T02:00:00Z")  # due at its slot: waits are measured from it
    schedule = store.schedule("s")
    assert (schedule.next_run_at, schedule.last_run_at, schedule.last_job_id, schedule.last_job_state) == (
        utc("2026-12-02T02:00:00Z"), utc("2026-12-01T02:00:00Z"), "s@2026-12-01T02:00:00Z", "pending")
    assert store.fire_schedules(utc("2026-12-01T02:00:01Z")) == []


def test_firing_is_idempotent_across_workers(store, tmp_path, request):
    add_schedule(store, now=T0, every="1m")
    other = queuectl.open_database(store.target)
    try:
        first = store.fire_schedules(T0 + 60.5)
        second = other.fire_schedules(T0 + 60.5)
    finally:
        other.close()
    assert [e[2] for e in first] == [f"s@{queuectl.slot_text(T0 + 60)}"] and second == []
    assert slot_job_ids(store) == [f"s@{queuectl.slot_text(T0 + 60)}"]


def test_firing_from_many_connections_at_once_makes_one_job_per_slot(store):
    add_schedule(store, now=T0, every="1m")
    made, errors = [], []

    def fire(now):
        mine = queuectl.open_database(store.target, busy_deadline_s=30.0)
        try:
            for _ in range(5):
                made.extend(e[2] for e in mine.fire_schedules(now) if e[2])
        except Exception as e:  # noqa: BLE001 - any failure is the bug under test
            errors.append(e)
        finally:
            mine.close()
    threads = [threading.Thread(target=fire, args=(T0 + 60 * 3 + 1,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert made == slot_job_ids(store) == [f"s@{queuectl.slot_text(T0 + 180)}"]


def test_a_slot_whose_job_exists_already_is_not_made_again(store):
    add_schedule(store, now=T0, every="1m")
    taken = f"s@{queuectl.slot_text(T0 + 60)}"
    store.enqueue([spec(taken, command="echo mine")], T0)
    assert store.fire_schedules(T0 + 61) == [("s", T0 + 60, None, f"job {taken} already exists")]
    assert store.get(taken).command == "echo mine" and store.schedule("s").next_run_at == T0 + 120


def test_catch_up_fires_only_the_most_recent_missed_slot_once(store):
    add_schedule(store, now=utc("2026-12-01T00:00:00Z"), cron="*/5 * * * *")
    # no worker ran for three hours and a bit
    events = store.fire_schedules(utc("2026-12-01T03:07:30Z"))
    assert [e[2] for e in events] == ["s@2026-12-01T03:05:00Z"]
    assert slot_job_ids(store) == ["s@2026-12-01T03:05:00Z"]
    assert store.schedule("s").next_run_at == utc("2026-12-01T03:10:00Z")
    assert store.fire_schedules(utc("2026-12-01T03:09:59Z")) == []


def test_overlap_skip_skips_slots_while_the_last_job_outlasts_its_interval(store):
    add_schedule(store, now=T0, every="1m")
    register(store)
    first = store.fire_schedules(T0 + 60)[0][2]
    job = store.claim("w1", T0 + 60)
    assert job.id == first  # it runs, and is still running one and two intervals later
    for slot in (T0 + 120, T0 + 180):
        assert store.fire_schedules(slot) == [("s", None, None, f"slot skipped (overlap skip): job {first} "
                                                                "is still processing")]
    assert slot_job_ids(store) == [first] and store.schedule("s").next_run_at == T0 + 240
    store.finish(job, "w1", outcome(), SETTINGS, T0 + 200)
    assert [e[2] for e in store.fire_schedules(T0 + 240)] == [f"s@{queuectl.slot_text(T0 + 240)}"]


def test_overlap_skip_also_waits_for_a_failed_job_and_not_for_a_dead_or_deleted_one(store):
    add_schedule(store, now=T0, every="1m")
    register(store)
    first = store.fire_schedules(T0 + 60)[0][2]
    store.finish(store.claim("w1", T0 + 60), "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 61)
    assert store.get(first).state == "failed"
    assert store.fire_schedules(T0 + 120)[0][1] is None  # failed: a retry is coming
    store.cancel([first], T0 + 150)
    second = store.fire_schedules(T0 + 180)[0][2]
    assert second == f"s@{queuectl.slot_text(T0 + 180)}"  # dead: no longer in the way
    store.delete([second])
    assert store.fire_schedules(T0 + 240)[0][2] == f"s@{queuectl.slot_text(T0 + 240)}"  # deleted: neither


@pytest.mark.parametrize("running", [True, False])
def test_a_re_added_schedule_takes_the_newest_job_of_its_id_as_its_previous_one(store, running):
    # `schedule remove` then `add` (how a schedule is changed) must not let a second job start beside
    # the first: the new schedule starts from the latest slot job its id made.
    add_schedule(store, now=T0, every="1m")
    register(store)
    older = store.fire_schedules(T0 + 60)[0][2]
    store.delete([older])
    newest = store.fire_schedules(T0 + 120)[0][2]
    job = store.claim("w1", T0 + 120) if running else None
    assert job is None or job.id == newest
    store.remove_schedules(["s"])
    # ids that only look like slot jobs of "s": no real time, another shape, another schedule's
    lookalikes = ["s@9999-99-99T99:99:99Z", "s@2099-02-31T00:00:00Z", "s@2099-01-01T00:00:00Zx",
                  "s@2099-1-1T0:0:0Z", "s@2099-01-01 00:00:00Z", "s@x", "sx@2099-01-01T00:00:00Z",
                  "s@2099-01-01T00:00:00Z@2099-01-01T00:00:00Z"]
    store.enqueue([spec(job_id) for job_id in lookalikes], T0 + 121)
    store.enqueue([spec(f"s@{queuectl.slot_text(T0 + 100)}")], T0 + 122)  # a slot before the newest one
    add_schedule(store, now=T0 + 130, every="1m")
    schedule = store.schedule("s")
    state = "processing" if running else "pending"
    assert (schedule.last_job_id, schedule.last_run_at, schedule.last_job_state) == (newest, T0 + 120, state)
    assert store.fire_schedules(T0 + 190) == [("s", None, None, f"slot skipped (overlap skip): job {newest} "
                                                                f"is still {state}")]
    if running:  # completed, or deleted: no longer in the way
        store.finish(job, "w1", outcome(), SETTINGS, T0 + 200)
    else:
        store.delete([newest])
    assert store.fire_schedules(T0 + 250)[0][2] == f"s@{queuectl.slot_text(T0 + 250)}"


def test_schedule_remove_then_add_keeps_the_previous_job(db):
    ok(db, "schedule", "add", '{"id": "b", "every": "1h", "command": "true"}')
    with opened(db) as s:
        made = s.fire_schedules(s.now() + 3600.5)[0][2]
    ok(db, "schedule", "remove", "b")
    ok(db, "schedule", "add", '{"id": "b", "cron": "@hourly", "command": "true"}')
    [listed] = json.loads(ok(db, "schedule", "list", "--json"))
    assert (listed["last_job_id"], listed["last_job_state"]) == (made, "pending")
    assert f"{made} (pending)" in ok(db, "schedule", "list")


def test_postgres_a_re_added_schedule_finds_its_previous_job_whatever_the_database_collation(pg_server):
    # ICU's en-US sorts punctuation before digits ('b@9' > 'b@:'), where C.UTF-8, the test servers'
    # collation, sorts by code point: the slot jobs of an id must be found in byte order on either.
    import psycopg
    from urllib.parse import urlsplit
    database = f"icu_{uuid.uuid4().hex}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        try:
            conn.execute(f"CREATE DATABASE {database} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
        except psycopg.Error as e:
            pytest.skip(f"this server has no ICU collation: {e}")
    try:
        db = urlsplit(pg_server)._replace(path=f"/{database}").geturl()
        ok(db, "schedule", "add", '{"id": "b", "every": "1h", "command": "true"}')
        with opened(db) as s:
            made = s.fire_schedules(s.now() + 3600.5)[0][2]
        ok(db, "schedule", "remove", "b")
        ok(db, "schedule", "add", '{"id": "b", "cron": "@hourly", "command": "true"}')
        [listed] = json.loads(ok(db, "schedule", "list", "--json"))
        assert (listed["last_job_id"], listed["last_job_state"]) == (made, "pending")
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database} WITH (FORCE)")


def test_overlap_allow_fires_while_the_last_job_runs(store):
    add_schedule(store, now=T0, every="1m", overlap="allow")
    register(store)
    store.fire_schedules(T0 + 60)
    store.claim("w1", T0 + 60)
    assert store.fire_schedules(T0 + 120)[0][2] == f"s@{queuectl.slot_text(T0 + 120)}"


def test_paused_schedule_fires_nothing_and_resumes_without_catching_up(store):
    add_schedule(store, now=T0, every="1m")
    store.pause_schedules(["s"])
    assert store.next_schedule_at() is None
    assert store.fire_schedules(T0 + 600) == [] and slot_job_ids(store) == []
    store.resume_schedules(["s"], T0 + 630)
    assert store.schedule("s").next_run_at == T0 + 660  # the slots missed while paused are gone
    assert store.fire_schedules(T0 + 630) == []
    assert [e[2] for e in store.fire_schedules(T0 + 660)] == [f"s@{queuectl.slot_text(T0 + 660)}"]
    store.resume_schedules(["s"], T0 + 700)  # not paused: left as it was
    assert store.schedule("s").next_run_at == T0 + 720


def test_pause_resume_remove_are_all_or_nothing_and_jobs_made_stay(store):
    add_schedule(store, now=T0, every="1m")
    add_schedule(store, now=T0, id="t", cron="@hourly")
    made = store.fire_schedules(T0 + 60)[0][2]
    for change in (store.pause_schedules, store.remove_schedules,
                   lambda ids: store.resume_schedules(ids, T0)):
        with pytest.raises(queuectl.NotFound, match="'nope'"):
            change(["s", "nope", "t"])
        assert [(s.id, s.paused) for s in store.schedules()] == [("s", False), ("t", False)]
    store.remove_schedules(["s", "t"])
    assert store.schedules() == [] and slot_job_ids(store) == [made]


def test_a_schedule_this_host_cannot_compute_is_left_for_another_worker(store):
    add_schedule(store, now=T0, cron="* * * * *", tz="Europe/Berlin")
    add_schedule(store, now=T0, id="t", every="1m")
    store.write(lambda cur: cur.execute("UPDATE schedules SET tz = 'Nowhere/Gone' WHERE id = 's'"))
    events = store.fire_schedules(T0 + 60)
    assert events[0][:3] == ("s", None, None) and "Nowhere/Gone" in events[0][3]
    assert events[1][2] == f"t@{queuectl.slot_text(T0 + 60)}"
    assert store.schedule("s").next_run_at == T0 + 60  # untouched


def test_schedule_firer_looks_up_once_a_second_and_fires_a_known_slot_at_once(store, monkeypatch):
    add_schedule(store, now=T0, every="10s")
    lookups = []
    real = store.next_schedule_at
    monkeypatch.setattr(store, "next_schedule_at", lambda: lookups.append(1) or real())
    firer = queuectl.ScheduleFirer()
    assert firer.tick(store, mono=100.0, now=T0 + 1) == [] and len(lookups) == 1
    for mono in (100.05, 100.5, 100.95):  # nothing due: no lookup within the second
        assert firer.tick(store, mono=mono, now=T0 + 2) == []
    assert len(lookups) == 1
    firer.tick(store, mono=101.0, now=T0 + 3)
    assert len(lookups) == 2
    events = firer.tick(store, mono=101.02, now=T0 + 10.01)  # the slot it knows of is due: no waiting
    assert [e[2] for e in events] == [f"s@{queuectl.slot_text(T0 + 10)}"]
    assert firer.due_at == T0 + 20


def test_schedule_firer_set_back_by_the_clock_sleeps_until_the_slot_not_in_a_busy_loop(store):
    add_schedule(store, now=T0, every="10s")
    firer = queuectl.ScheduleFirer()
    firer.tick(store, mono=108.5, now=T0 + 9.5)  # a lookup: the slot T0 + 10 is half a second away
    assert firer.next_tick() == 109.0
    assert firer.tick(store, mono=109.0, now=T0 - 51.0) == []  # the clock was set back a minute meanwhile
    assert firer.next_tick() > 109.0  # else the worker's next round is at once, again and again, until a lookup


def test_schedule_json_round_trips_through_the_store(store):
    add_schedule(store, now=T0, cron="0 2 * * *", tz="Europe/Berlin", overlap="allow", env={"K": "v"})
    assert store.schedule("s").to_dict() == {
        "id": "s", "cron": "0 2 * * *", "every": None, "tz": "Europe/Berlin", "overlap": "allow", "paused": False,
        "next_run_at": queuectl.iso(queuectl.next_cron_slot(queuectl.parse_cron("0 2 * * *"),
                                                             queuectl.zone_of("Europe/Berlin"), T0)),
        "last_run_at": None, "last_job_id": None, "last_job_state": None,
        "job": {"command": "true", "env": {"K": "v"}, "cwd": "/"}}


def test_a_schedule_this_host_cannot_fire_is_logged_once_not_every_second(store, caplog):
    add_schedule(store, now=T0, every="1m", overlap="allow")
    add_schedule(store, now=T0, id="z", cron="* * * * *", tz="Europe/Berlin")
    store.write(lambda cur: cur.execute("UPDATE schedules SET tz = 'Nowhere/Gone' WHERE id = 'z'"))
    firer = queuectl.ScheduleFirer()
    with caplog.at_level("INFO", logger="queuectl"):
        for second in range(1, 200):  # a worker looks again each second while it stays due
            firer.tick(store, mono=100.0 + second, now=T0 + second)
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("schedule z:")] == [
        "schedule z: not fired here: unknown time zone 'Nowhere/Gone' (use an IANA name such as Europe/Berlin or UTC)"]
    assert sum(m.startswith("schedule s: job s@") for m in messages) == 3  # the others still fire and say so


def test_a_schedule_stuck_due_here_hides_the_next_slot_of_another_for_a_second_at_most(store):
    """A schedule this host cannot fire stays due: the earliest slot a lookup finds is its own, long passed, and
    the next slot of every other is unknown until the next lookup. That one is a second away, as on SQLite, also
    for a PostgreSQL worker whose listener hears (lookups NOTIFIED_POLL_INTERVAL_S apart): no other schedule's
    slot fires that much later."""
    add_schedule(store, now=T0, id="z", cron="* * * * *", tz="Europe/Berlin")
    add_schedule(store, now=T0, every="2s", overlap="allow")
    store.write(lambda cur: cur.execute("UPDATE schedules SET tz = 'Nowhere/Gone' WHERE id = 'z'"))
    firer = queuectl.ScheduleFirer(heard=lambda: True)  # lookups NOTIFIED_POLL_INTERVAL_S apart
    events = firer.tick(store, mono=100.0, now=T0 + 60.5)  # z's slot T0 + 60 stays due; s's next is T0 + 62
    assert [e[0] for e in events if e[2]] == ["s"] and store.schedule("z").next_run_at == T0 + 60
    assert firer.next_tick() <= 100.0 + queuectl.SCHEDULE_CHECK_S
    events = firer.tick(store, mono=102.0, now=T0 + 62.5)
    assert [e[2] for e in events if e[2]] == [f"s@{queuectl.slot_text(T0 + 62)}"]


def test_an_update_keeps_the_last_job_so_overlap_skip_still_waits_for_it(store):
    add_schedule(store, now=T0, every="1m", command="echo old")
    register(store)
    first = store.fire_schedules(T0 + 60)[0][2]
    assert store.claim("w1", T0 + 60).id == first  # still running when the schedule changes
    store.update_schedule(queuectl.validate_schedule({"id": "s", "every": "30s", "tz": "UTC", "command": "echo new"},
                                                     CONFIG_DEFAULTS_INTERNAL, "/", T0 + 70), T0 + 70)
    assert store.fire_schedules(T0 + 90) == [("s", None, None, f"slot skipped (overlap skip): job {first} "
                                                               "is still processing")]
    changed = store.schedule("s")
    assert (changed.every_s, changed.job["command"], changed.last_job_id) == (30, "echo new", first)


def test_an_update_fires_no_slot_already_passed_and_keeps_an_every_schedules_slot_times(store):
    add_schedule(store, now=T0, every="10s")  # slots T0 + 10, + 20, ...; none fired (no worker ran)
    store.pause_schedules(["s"])
    store.update_schedule(queuectl.validate_schedule({"id": "s", "every": "20s", "tz": "UTC", "command": "true"},
                                                     CONFIG_DEFAULTS_INTERNAL, "/", T0 + 95), T0 + 95)
    changed = store.schedule("s")
    assert changed.paused and changed.created_at == T0  # still paused, still counted from its add
    store.resume_schedules(["s"], T0 + 95)
    assert store.schedule("s").next_run_at == T0 + 100  # T0 + 20k: the missed T0 + 20 ... T0 + 80 are gone
    assert store.fire_schedules(T0 + 99) == []
    assert [e[2] for e in store.fire_schedules(T0 + 100.5)] == [f"s@{queuectl.slot_text(T0 + 100)}"]
    store.update_schedule(queuectl.validate_schedule({"id": "s", "cron": "*/5 * * * *", "tz": "UTC", "command": "true"},
                                                     CONFIG_DEFAULTS_INTERNAL, "/", T0 + 400), T0 + 400)
    assert store.schedule("s").next_run_at == T0 + 600  # 08:10:00, not the overdue T0 + 120 nor 08:05:00
    assert store.fire_schedules(T0 + 400) == []


def test_a_runner_logs_its_claim_of_a_slot_job_after_the_firing_logged_it(store, caplog):
    """PostgreSQL wakes the runners at the firing's commit: one claimed the slot's job and logged it before
    the firer, back from the commit, logged the job as enqueued."""
    add_schedule(store, now=T0, every="10s")
    register(store)
    firer, asked = queuectl.ScheduleFirer(), []
    runner = queuectl.Runner(store, "w1", lambda job, registration: None,
                             claim_may_log=lambda job_id: asked.append(job_id) or firer.claim_may_log(job_id))
    runner.execute = lambda job, env, abort, on_output: outcome(0)
    claimer, log_events = threading.Thread(target=runner.run_once, args=(T0 + 10.5,)), firer._log

    def claimed_first(events):  # committed, not logged yet: the runner claims the job now
        claimer.start()
        wait_for(lambda: asked or any("claimed" in r.getMessage() for r in caplog.records), "the claim")
        log_events(events)
    firer._log = claimed_first
    with caplog.at_level("INFO", logger="queuectl"):
        firer.tick(store, mono=100.0, now=T0 + 10.5)
        claimer.join(WAIT_S)
    job_id = f"s@{queuectl.slot_text(T0 + 10)}"
    assert [r.getMessage().partition(" (")[0] for r in caplog.records][:2] == [
        f"schedule s: job {job_id} enqueued", f"job {job_id} claimed"]
    assert not firer.unlogged


# ---- the schedule commands -----------------------------------------------------------------------

def test_schedule_add_list_and_next(db, tmp_path):
    assert ok(db, "schedule", "add", json.dumps({"id": "backup", "cron": "30 2 * * *", "tz": "Europe/Berlin",
                                                 "command": "./backup.sh", "cwd": str(tmp_path)})) == "backup\n"
    assert ok(db, "schedule", "add", '{"id": "tick", "every": "15m", "command": "date", "overlap": "allow"}') \
        == "tick\n"
    listed = json.loads(ok(db, "schedule", "list", "--json"))
    assert [set(s) for s in listed] == [SCHEDULE_KEYS, SCHEDULE_KEYS]
    backup, tick = listed
    assert (backup["cron"], backup["every"], backup["tz"], backup["overlap"], backup["paused"]) == (
        "30 2 * * *", None, "Europe/Berlin", "skip", False)
    assert backup["job"] == {"command": "./backup.sh", "cwd": str(tmp_path)}
    assert (tick["cron"], tick["every"], tick["overlap"], tick["job"]["cwd"]) == (None, 900, "allow", os.getcwd())
    assert ISO_UTC.match(backup["next_run_at"]) and backup["last_run_at"] is None
    text = ok(db, "schedule", "list")
    assert "every 15m" in text and "30 2 * * *" in text and "Europe/Berlin" in text and "./backup.sh" in text
    assert ok(db, "schedule", "next", "backup", "--after", "2026-03-27T00:00:00Z", "--count", "4").split() == [
        "2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    assert ok(db, "schedule", "next", "backup", "--after", str(int(utc("2026-03-27T00:00:00Z"))),
              "--count", "1").split() == ["2026-03-27T01:30:00Z"]
    slots = ok(db, "schedule", "next", "tick").split()
    assert len(slots) == 5 and all(ISO_UTC.match(s) for s in slots)
    assert slots[0] == queuectl.slot_text(parse_iso(tick["next_run_at"]).timestamp())


def test_schedule_zone_defaults_to_the_machines(db, local_tz):
    local_tz("America/New_York")
    ok(db, "schedule", "add", '{"id": "a", "cron": "0 9 * * *", "command": "true"}')
    local_tz(":Europe/Berlin")
    ok(db, "schedule", "add", '{"id": "b", "cron": "0 9 * * *", "command": "true"}')
    assert [s["tz"] for s in json.loads(ok(db, "schedule", "list", "--json"))] == ["America/New_York",
                                                                                   "Europe/Berlin"]
    local_tz("EST5EDT,M3.2.0,M11.1.0")  # a POSIX rule, not a zone name: refused, naming it
    code, _, err = cli(db, "schedule", "add", '{"id": "c", "cron": "0 9 * * *", "command": "true"}')
    assert code == 2
    assert_one_error(err, "EST5EDT,M3.2.0,M11.1.0", "'tz'")


def test_local_zone_name_reads_tz_then_etc_localtime(monkeypatch):
    monkeypatch.setenv("TZ", "/usr/share/zoneinfo/Asia/Tokyo")
    assert queuectl.local_zone_name() == "Asia/Tokyo"
    monkeypatch.delenv("TZ")
    monkeypatch.setattr(queuectl.os, "readlink", lambda path: "../usr/share/zoneinfo/Europe/Paris")
    assert queuectl.local_zone_name() == "Europe/Paris"

    def missing(path):
        raise FileNotFoundError(path)
    monkeypatch.setattr(queuectl.os, "readlink", missing)
    assert queuectl.local_zone_name() == "UTC"


@sqlite_only
@pytest.mark.parametrize("obj,named", [
    ({"cron": "0 * * * *", "command": "true"}, "field 'id' is required"),
    ({"id": "a", "command": "true"}, "exactly one of the fields 'cron' and 'every'"),
    ({"id": "a", "cron": "0 * * * *", "every": "1m", "command": "true"}, "exactly one"),
    ({"id": "a", "cron": "0 * * * * *", "command": "true"}, "cron '0 * * * * *'"),
    ({"id": "a", "cron": "0 25 * * *", "command": "true"}, "hour '25'"),
    ({"id": "a", "cron": "0 0 30 2 *", "command": "true"}, "never fires"),
    ({"id": "a", "cron": 5, "command": "true"}, "field 'cron'"),
    ({"id": "a", "every": "0s", "command": "true"}, "field 'every'"),
    ({"id": "a", "every": "soon", "command": "true"}, "field 'every'"),
    ({"id": "a", "every": "1m", "tz": "Mars/Olympus", "command": "true"}, "field 'tz'"),
    ({"id": "a", "every": "1m", "tz": "../etc/passwd", "command": "true"}, "field 'tz'"),
    ({"id": "a", "every": "1m", "tz": "localtime", "command": "true"}, "localtime"),
    ({"id": "a", "every": "1m", "overlap": "queue", "command": "true"}, "field 'overlap'"),
    ({"id": "a", "every": "1m"}, "field 'command' is required"),
    ({"id": "a", "every": "1m", "command": "true", "priority": "high"}, "field 'priority'"),
    ({"id": "a", "every": "1m", "command": "true", "run_at": 0}, "field 'run_at' cannot be used"),
    ({"id": "a", "every": "1m", "command": "true", "delay": 5}, "field 'delay' cannot be used"),
    ({"id": "a", "every": "1m", "command": "true", "depends_on": []}, "field 'depends_on' cannot be used"),
    ({"id": "a", "every": "1m", "command": "true", "when": 1}, "unknown field 'when'"),
    ({"id": "x" * 171, "every": "1m", "command": "true"}, "1 to 170 characters"),
    ({"id": "a\nb", "every": "1m", "command": "true"}, "control characters"),
    ([1], "schedule must be a JSON object"),
])
def test_schedule_add_refuses_invalid_input_naming_it_and_stores_nothing(db, obj, named):
    ok(db, "schedule", "add", '{"id": "keep", "every": "1h", "command": "true"}')
    before = ok(db, "schedule", "list", "--json")
    code, out, err = cli(db, "schedule", "add", json.dumps(obj))
    assert (code, out) == (2, "")
    assert_one_error(err, named)
    assert ok(db, "schedule", "list", "--json") == before


def test_schedule_id_of_170_characters_makes_job_ids_that_fit(db):
    long_id = "s" * 170
    ok(db, "schedule", "add", json.dumps({"id": long_id, "every": "1s", "command": "true"}))
    with opened(db) as s:
        made = s.fire_schedules(s.now() + 2)[0][2]
    assert len(made) == 191 <= queuectl.MAX_ID_CHARS and get_job(db, made)["id"] == made


def test_schedule_add_duplicate_exits_1_and_keeps_the_first(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1h", "command": "first"}')
    code, out, err = cli(db, "schedule", "add", '{"id": "a", "cron": "@daily", "command": "second"}')
    assert (code, out) == (1, "")
    assert_one_error(err, "schedule 'a' already exists")
    [only] = json.loads(ok(db, "schedule", "list", "--json"))
    assert (only["every"], only["job"]["command"]) == (3600, "first")


def test_schedule_pause_resume_remove_commands(db):
    for name in ("a", "b"):
        ok(db, "schedule", "add", json.dumps({"id": name, "every": "1h", "command": "true"}))
    before = ok(db, "schedule", "list", "--json")
    for action in ("pause", "resume", "remove"):
        code, out, err = cli(db, "schedule", action, "a", "missing")
        assert (code, out) == (1, "")
        assert_one_error(err, "no schedule with id 'missing'")
        assert ok(db, "schedule", "list", "--json") == before
    assert ok(db, "schedule", "pause", "a", "a") == "a\n"
    listed = {s["id"]: s for s in json.loads(ok(db, "schedule", "list", "--json"))}
    assert listed["a"]["paused"] is True and listed["a"]["next_run_at"] is None
    assert "paused" in ok(db, "schedule", "list").splitlines()[1]
    assert ok(db, "schedule", "resume", "a") == "a\n"
    assert json.loads(ok(db, "schedule", "list", "--json"))[0]["next_run_at"] is not None
    assert ok(db, "schedule", "remove", "a", "b") == "a\nb\n"
    assert json.loads(ok(db, "schedule", "list", "--json")) == []
    code, _, err = cli(db, "schedule", "next", "a")
    assert code == 1
    assert_one_error(err, "no schedule with id 'a'")


def test_schedule_update_replaces_the_schedule_and_keeps_its_history(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1s", "command": "echo old", "overlap": "skip"}')
    with opened(db) as s:
        made = s.fire_schedules(s.now() + 1.5)[0][2]
    before = json.loads(ok(db, "schedule", "list", "--json"))[0]
    new = {"cron": "0 3 * * *", "tz": "Asia/Tokyo", "overlap": "allow", "command": "echo new", "queue": "nightly"}
    started = time.time()
    assert ok(db, "schedule", "update", "a", json.dumps(new)) == "a\n"
    assert ok(db, "schedule", "update", "a", json.dumps({"id": "a", **new})) == "a\n"  # its own id may be given
    [after] = json.loads(ok(db, "schedule", "list", "--json"))
    assert (after["cron"], after["every"], after["tz"], after["overlap"]) == ("0 3 * * *", None, "Asia/Tokyo", "allow")
    assert after["job"] == {"command": "echo new", "queue": "nightly", "cwd": os.getcwd()}
    assert (after["last_job_id"], after["last_run_at"], after["paused"]) == (made, before["last_run_at"], False)
    first = queuectl.next_cron_slot(queuectl.parse_cron("0 3 * * *"), zoneinfo.ZoneInfo("Asia/Tokyo"), started)
    assert after["next_run_at"] == queuectl.iso(first)  # computed from now: 03:00 in Tokyo, 18:00 UTC
    assert get_job(db, made)["command"] == "echo old"  # a job already made is left as it is


def test_schedule_update_leaves_passed_a_slot_a_worker_fired_while_it_waited(db, monkeypatch):
    # `schedule update` reads the clock, then may wait for the database while a worker fires the slot that
    # follows: that slot stays passed, not made the next one again.
    ok(db, "schedule", "add", '{"id": "a", "every": "1s", "overlap": "allow", "command": "true"}')
    validate = queuectl.validate_schedule

    def a_worker_fires_meanwhile(obj, defaults, cwd, now):
        with opened(db) as s:
            slot = queuectl.next_slot(s.schedule("a"), now)
            wait_for(lambda: s.now() > slot, "the slot after the update's clock to pass")
            assert s.fire_schedules(s.now())[0][1] >= slot
        return validate(obj, defaults, cwd, now)
    monkeypatch.setattr(queuectl, "validate_schedule", a_worker_fires_meanwhile)
    assert ok(db, "schedule", "update", "a", '{"every": "1s", "overlap": "allow", "command": "echo new"}') == "a\n"
    [after] = json.loads(ok(db, "schedule", "list", "--json"))
    assert after["next_run_at"] > after["last_run_at"], after


def test_schedule_update_refusals_change_nothing(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1h", "command": "true"}')
    before = ok(db, "schedule", "list", "--json")
    for args, code, named in (
            (("missing", '{"every": "1m", "command": "true"}'), 1, "no schedule with id 'missing'"),
            (("a", '{"id": "b", "every": "1m", "command": "true"}'), 2, "field 'id' 'b' is not the schedule updated"),
            (("a", "every 1m"), 2, "invalid JSON"), (("a", "[1]"), 2, "schedule must be a JSON object"),
            (("a", '{"cron": "61 * * * *", "command": "true"}'), 2, "minute '61'"),
            (("a", '{"every": "1m"}'), 2, "field 'command' is required"),
            (("a", '{"every": "1m", "command": "true", "run_at": 0}'), 2, "field 'run_at' cannot be used")):
        got, out, err = cli(db, "schedule", "update", *args)
        assert (got, out) == (code, ""), (args, err)
        assert_one_error(err, named)
        assert ok(db, "schedule", "list", "--json") == before


@sqlite_only
def test_schedule_next_checks_its_options(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1h", "command": "true"}')
    for args, named in ((("--count", "0"), "--count"), (("--after", "tomorrow"), "--after")):
        code, out, err = cli(db, "schedule", "next", "a", *args)
        assert code == 2 and out == "" and any(named in line for line in err.splitlines()), err


def test_schedule_next_of_an_expression_prints_its_slots_and_opens_no_database(tmp_path, monkeypatch, local_tz):
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    nowhere = str(tmp_path / "none.db")
    code, out, err = run_main(["--db", nowhere, "schedule", "next", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
                               "--after", "2026-03-27T00:00:00Z", "--count", "4"])
    assert (code, err) == (0, "")
    assert out.split() == ["2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z",
                           "2026-03-30T00:30:00Z"]  # as `schedule next ID` of the same schedule (above)
    local_tz("Asia/Tokyo")  # without --tz, the zone `schedule add` would store: this machine's
    code, out, _ = run_main(["schedule", "next", "--cron", "@daily", "--after", "2026-03-27T00:00:00Z", "--count", "1"])
    assert (code, out) == (0, "2026-03-27T15:00:00Z\n")
    before = time.time()
    code, out, _ = run_main(["schedule", "next", "--every", "15m", "--count", "3"])  # as if added now
    slots = [utc(slot) for slot in out.split()]
    assert code == 0 and len(slots) == 3 and [b - a for a, b in zip(slots, slots[1:])] == [900, 900]
    assert math.floor(before) + 900 <= slots[0] <= time.time() + 900
    assert os.listdir(tmp_path) == []  # neither --db nor ./queuectl.db was created


@pytest.mark.parametrize("args,named", [
    (("--cron", "61 * * * *"), "minute '61'"), (("--cron", "0 0 30 2 *"), "never fires"),
    (("--cron", "@daily", "--tz", "Mars/Olympus"), "'Mars/Olympus'"), (("--every", "1.5m"), "--every"),
    (("--every", "0s"), "--every"), (("--every", "15m", "--tz", "UTC"), "--tz goes with --cron"),
    (("a", "--cron", "@daily"), "not both ID and --cron"), (("--cron", "@daily", "--every", "1h"), "not both"),
    ((), "give a schedule ID, --cron EXPR or --every DURATION"), (("--cron", "@daily", "--count", "0"), "--count"),
])
def test_schedule_next_of_a_bad_expression_exits_2_and_creates_nothing(tmp_path, monkeypatch, args, named):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["--db", str(tmp_path / "none.db"), "schedule", "next", *args])
    assert (code, out) == (2, "")
    assert named in err.splitlines()[-1] and err.splitlines()[-1].startswith(ERROR_PREFIX), err
    assert os.listdir(tmp_path) == []


def test_schedule_list_shows_the_last_job_and_its_state(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1s", "command": "true"}')
    with opened(db) as s:
        made = s.fire_schedules(s.now() + 1.5)[0][2]
    [listed] = json.loads(ok(db, "schedule", "list", "--json"))
    assert (listed["last_job_id"], listed["last_job_state"]) == (made, "pending")
    assert listed["last_run_at"] == queuectl.iso(utc(made.partition("@")[2]))
    assert f"{made} (pending)" in ok(db, "schedule", "list")


def test_an_existing_database_gains_schedules_on_upgrade(db, monkeypatch):
    with monkeypatch.context() as old:  # a queue made by the version before schedules
        old.setattr(queuectl, "SCHEMA_VERSION", 1)
        old.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:1])
        old.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:1])
        with opened(db) as s:
            enqueue_older(s, "old", now=s.now())
    ok(db, "schedule", "add", '{"id": "a", "every": "1h", "command": "true"}')
    assert get_job(db, "old")["state"] == "pending"
    with opened(db) as s:
        version = s.read("PRAGMA user_version" if not is_pg(db) else "SELECT version FROM queuectl_version")
    assert version == [(queuectl.SCHEMA_VERSION,)] and queuectl.SCHEMA_VERSION >= 2


@sqlite_only
def test_schedule_add_survives_hostile_input_and_a_refusal_changes_nothing(db):
    import random
    rng = random.Random(11)
    pool = {
        "id": ["a", "b", "", "x" * 171, "a\u2028b", 5, None, "dup"],
        "cron": ["* * * * *", "@daily", "@reboot", "61 * * * *", "*/0 * * * *", "0 0 30 2 *", "mon-fri * * * *",
                 "* * * * mon-fri", "1-5/2 * * jan *", "", "\x00", 7, ["* * * * *"], "* * * * * *", "٣ * * * *"],
        "every": ["1s", "0s", "1.5m", "2h", "1w", 0, -1, 1, 10**20, "10**3", True, "", "٣s", {"s": 1}],
        "tz": ["UTC", "Europe/Berlin", "../../etc/passwd", "", "localtime", "Nowhere/X", 3, "UTC\x00", "/etc/hosts"],
        "overlap": ["skip", "allow", "queue", None, 1],
        "command": ["true", "", " ", None, 1, "echo \udcff"], "queue": ["q", "", "a b"], "priority": [1, "1", 1.5],
        "env": [{"A": "b"}, {"": "x"}, ["A"]], "cwd": ["/", "rel", ""], "timeout": [1, -1, "x"],
        "max_retries": [0, -1, 10**7], "run_at": [0], "delay": [1], "depends_on": [[]], "zzz": [1],
    }
    ok(db, "schedule", "add", '{"id": "dup", "every": "1h", "command": "true"}')
    codes = []
    for _ in range(150):
        kind = rng.choice(["cron", "every"])
        obj = {"id": rng.choice(pool["id"]), kind: rng.choice(pool[kind]), "command": "true"}
        for key in rng.sample(sorted(pool), rng.randint(0, 4)):
            obj[key] = rng.choice(pool[key])
        before = ok(db, "schedule", "list", "--json")
        code, out, err = cli(db, "schedule", "add", json.dumps(obj))
        codes.append(code)
        assert "Traceback" not in err, (obj, err)
        if code == 0:
            assert out == f"{obj['id']}\n"
            ok(db, "schedule", "remove", obj["id"])
        else:
            assert code in (1, 2) and out == "", (obj, code, err)
            assert_one_error(err)
            assert code == 2 or "already exists" in err, (obj, err)
        assert ok(db, "schedule", "list", "--json") == before
    assert {0, 1, 2} <= set(codes)  # the mix reached acceptance, the duplicate and refusals


def test_schedule_next_ends_quietly_at_the_last_storable_time(db):
    ok(db, "schedule", "add", '{"id": "w", "every": "1w", "command": "true"}')
    ok(db, "schedule", "add", '{"id": "c", "cron": "@yearly", "tz": "UTC", "command": "true"}')
    near_end = str(queuectl.MAX_UNIX_TIME - 86400)
    assert len(ok(db, "schedule", "next", "w", "--after", near_end).split()) <= 1
    assert ok(db, "schedule", "next", "c", "--after", near_end) == ""


def test_schedule_next_near_the_last_storable_time_in_a_zone_east_of_utc_ends_quietly(db):
    # Kiritimati is UTC+14: there, the last storable second is already in year 10000 on the clock.
    ok(db, "schedule", "add", '{"id": "k", "cron": "* * * * *", "tz": "Pacific/Kiritimati", "command": "true"}')
    for after in (queuectl.MAX_UNIX_TIME, queuectl.MAX_UNIX_TIME - 12 * 3600):
        assert ok(db, "schedule", "next", "k", "--after", str(after)) == ""


def test_local_zone_name_follows_a_tz_that_names_etc_localtime(monkeypatch):
    # TZ=:/etc/localtime is set on many servers and containers (it spares the C library a stat per call)
    links = {"/etc/localtime": "../usr/share/zoneinfo/Europe/Paris"}
    monkeypatch.setattr(queuectl.os, "readlink", lambda path: links[path])
    for tz in (":/etc/localtime", "/etc/localtime"):
        monkeypatch.setenv("TZ", tz)
        assert queuectl.local_zone_name() == "Europe/Paris"
    monkeypatch.setenv("TZ", ":/usr/share/zoneinfo/Asia/Tokyo")  # a zone file itself: its name, as before
    assert queuectl.local_zone_name() == "Asia/Tokyo"


def test_a_cron_expression_is_stored_with_single_spaces_so_schedule_list_keeps_one_line_each(db):
    # Any whitespace separates the fields (a newline, a tab, U+2028, a no-break space): it must not reach
    # the one-line-per-schedule listing.
    for i, spaced in enumerate(("0 2 * *\n*", "0\t2 * * *\u2028", " 0  2 * *\u00a0* ")):
        ok(db, "schedule", "add", json.dumps({"id": f"s{i}", "cron": spaced, "tz": "UTC", "command": "true"}))
    assert [s["cron"] for s in json.loads(ok(db, "schedule", "list", "--json"))] == ["0 2 * * *"] * 3
    lines = ok(db, "schedule", "list").splitlines()
    assert len(lines) == 4 and all(" 0 2 * * * " in line for line in lines[1:])


def test_schedule_list_escapes_the_command_and_never_cuts_an_id(db):
    long_id = "nightly-backup-of-the-whole-database-" + "x" * 40
    with opened(db) as s:
        add_schedule(s, now=T0, id=long_id, every="10s", command=TERMINAL_HOSTILE)
        add_schedule(s, now=T0, id="short", every="10s", command="true")
        s.fire_schedules(T0 + 10.5)
    out = ok(db, "schedule", "list")
    assert_terminal_safe(out)
    header, *rows = out.splitlines()
    [row] = [r for r in rows if r.startswith(long_id)]
    assert row.startswith(long_id + " ") and row.endswith(" " + TERMINAL_SHOWN)  # whole: no terminal here
    assert row.index(" every ") == header.index(" SCHEDULE ")  # the columns stay aligned
    slot_job = f"{long_id}@{queuectl.slot_text(T0 + 10)}"
    assert row[header.index("LAST JOB"):].startswith(f"{slot_job} (pending) ")  # whole, so it can be copied
    listed = {s["id"]: s for s in json.loads(ok(db, "schedule", "list", "--json"))}
    assert listed[long_id]["job"]["command"] == TERMINAL_HOSTILE


def test_schedule_list_on_a_terminal_cuts_the_command_to_its_width_never_an_id(db, monkeypatch):
    command = "echo " + "word " * 60
    for schedule_id in ("s" * 170, "short"):
        ok(db, "schedule", "add", json.dumps({"id": schedule_id, "every": "1h", "tz": "UTC", "command": command}))
    monkeypatch.setenv("COLUMNS", "300")
    header, *rows = on_a_terminal(db, "schedule", "list").splitlines()
    assert [row.split(" ")[0] for row in rows] == ["short", "s" * 170]
    assert all(row.endswith("…") and len(row) == 300 for row in rows), rows  # cut to the terminal's width
    monkeypatch.setenv("COLUMNS", "100")  # no room left by the ids: a few words of the command, the line wraps
    assert all(row.endswith(" echo word word word…") for row in on_a_terminal(db, "schedule", "list").splitlines()[1:])
    assert ok(db, "schedule", "list").splitlines()[1].endswith(" " + command.strip())  # not a terminal: all of it


# ---- real workers --------------------------------------------------------------------------------

def test_workers_fire_an_every_second_schedule_once_per_slot(db, workers):
    ok(db, "schedule", "add", '{"id": "tick", "every": "1s", "command": "echo tick"}')
    procs = [workers.start(), workers.start()]

    def completed():
        jobs = [j for j in json.loads(ok_when_free(db, "list", "--json")) if j["state"] == "completed"]
        return jobs if len(jobs) >= 4 else None
    wait_for(completed, "four completed slots")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait() == 0, proc.log()
    jobs = json.loads(ok(db, "list", "--json"))
    slots = [utc(j["id"].partition("@")[2]) for j in jobs]
    assert all(j["id"].startswith("tick@") for j in jobs)
    assert len(set(slots)) == len(slots) and all(s == int(s) for s in slots)
    assert sorted(slots) == slots and all(b - a >= 1 for a, b in zip(slots, slots[1:]))
    assert set(run_counts(db).values()) == {1}  # every slot's job ran once, on one worker or the other
    for proc in procs:
        assert "Traceback" not in proc.log() and "not fired here" not in proc.log()


def test_a_workers_log_says_a_slot_job_was_enqueued_before_it_says_it_claimed_it(db, workers):
    ok(db, "schedule", "add", '{"id": "tick", "every": "1s", "command": "true"}')
    worker = workers.start("--count", "2")
    wait_for(lambda: worker.log().count(" claimed") >= 3, "three slot jobs claimed")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    lines = worker.log().splitlines()
    claimed = [(n, line.split("job ")[1].split()[0]) for n, line in enumerate(lines) if " claimed" in line]
    for n, job_id in claimed:
        assert any(f"schedule tick: job {job_id} enqueued" in line for line in lines[:n]), (job_id, lines)


def test_a_burst_worker_fires_due_slots_but_future_ones_do_not_keep_it_running(db, workers):
    ok(db, "schedule", "add", '{"id": "soon", "every": "1s", "command": "echo soon"}')
    ok(db, "schedule", "add", '{"id": "later", "cron": "@yearly", "command": "echo later"}')
    wait_for(lambda: json.loads(ok(db, "schedule", "list", "--json"))[1]["next_run_at"] < queuectl.iso(time.time()),
             "the every-second schedule to fall due")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    jobs = json.loads(ok(db, "list", "--json"))
    assert jobs and all(j["id"].startswith("soon@") and j["state"] == "completed" for j in jobs)
    assert "burst: queue drained" in worker.log()


def test_a_stopping_worker_fires_nothing(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1s", "command": "true"}')
    worker = queuectl.Worker(db, 1, False)
    try:
        wait_for(lambda: worker.store.next_schedule_at() < worker.store.now(), "the first slot")
        idle = dict.fromkeys(("beat", "sweep", "cancels", "retention", "poll"), math.inf)  # only schedules
        worker.stopping.set()
        worker._housekeeping(idle, time.monotonic(), woken=False)
        assert list_ids(db) == []
        worker.stopping.clear()
        worker._housekeeping(idle, time.monotonic(), woken=False)
        assert [i.partition("@")[0] for i in list_ids(db)] == ["a"]
    finally:
        worker.store.close()


def test_a_worker_round_looks_up_schedules_early_but_sleeps_until_the_slot_itself(db):
    ok(db, "schedule", "add", '{"id": "a", "every": "1h", "command": "true"}')
    worker = queuectl.Worker(db, 1, False)
    try:
        idle = dict.fromkeys(("beat", "sweep", "cancels", "retention", "poll"), math.inf)  # only schedules
        mono, before = time.monotonic(), worker.store.now()
        worker._housekeeping(idle, mono, woken=False)
        slot = worker.store.next_schedule_at()
        assert slot > before and worker.schedules.due_mono <= mono + (slot - before)  # not ROUND_SLACK_S late
    finally:
        worker.store.close()


def test_a_schedule_firing_logs_a_queuectl_event_with_its_schedule_and_job_not_the_foreign_log_event(
        store, caplog):
    """README: `--log-format json` gives each of queuectl's lines its event and fields; the event `log` is
    for another library's lines. A slot that fires is queuectl's own line, and a log shipper must be able
    to tell which schedule made which job."""
    add_schedule(store, now=T0, every="10s")
    with caplog.at_level("INFO", logger="queuectl"):
        queuectl.ScheduleFirer().tick(store, mono=100.0, now=T0 + 10.5)
    [record] = caplog.records
    line = json.loads(queuectl.JsonLines().format(record))
    assert line["event"] == "schedule_fired"
    assert (line["schedule_id"], line["job_id"]) == ("s", f"s@{queuectl.slot_text(T0 + 10)}")


# ==== Storage =====================================================================================

# ---- the store: opening, enqueue, claim, finish, recovery ----------------------------------------

def test_concurrent_first_opens_do_not_race(tmp_path):
    path = str(tmp_path / "race.db")
    assert open_concurrently(lambda: queuectl.SqliteStore(path)) == []
    s = queuectl.SqliteStore(path)
    assert s.read("PRAGMA user_version")[0][0] == queuectl.SCHEMA_VERSION
    s.close()


def test_opening_another_store_keeps_this_process_locks(tmp_path):
    # Regression: closing any descriptor of an SQLite file drops the process's POSIX locks, so
    # opening a second Store while the first holds the write lock must not release that lock.
    path = str(tmp_path / "locks.db")
    holder = queuectl.SqliteStore(path)
    holder.conn.execute("BEGIN IMMEDIATE")
    queuectl.SqliteStore(path).close()
    probe = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=0); c.execute('BEGIN IMMEDIATE')"
    result = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True)
    holder.conn.execute("ROLLBACK")
    holder.close()
    assert result.returncode != 0 and "locked" in result.stderr


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


def test_a_claimed_or_finished_job_has_every_field_as_stored(store):
    """The Job a claim and a result hand back is built from its fields directly (from_row, _finished), not
    through Job's constructor: each path must still set every field of Job.FIELDS (a field added to Job
    but not to a claim's RETURNING would be missing), with the values stored."""
    _claimed_and_finished_jobs_have_every_field(store)


def test_a_job_claimed_without_returning_has_every_field_as_stored(sqlite_store, monkeypatch):
    """The same through the claim of an SQLite before 3.35 (no RETURNING: the update, then a read)."""
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)
    _claimed_and_finished_jobs_have_every_field(sqlite_store)


def _claimed_and_finished_jobs_have_every_field(store):
    register(store)
    store.enqueue([spec("a", env={"K": "v"}, priority=2), spec("b", queue="q", max_retries=0),
                   spec("c", depends_on=["b"])], T0)
    job = store.claim("w1", T0)
    finished, following = store.finish_and_claim(job, "w1", outcome(), SETTINGS, T0 + 1, ())
    failed = store.finish(following, "w1", outcome(3, "boom"), SETTINGS, T0 + 2)
    for got in (job, finished, following, failed):
        assert tuple(vars(got)) == queuectl.Job.FIELDS, got
    assert (finished, failed) == (store.get("a"), store.get("b")) and failed.state == "dead"
    assert job == queuectl.Job(**{**vars(finished), "state": "processing", "worker_id": "w1", "updated_at": T0,
                                  "last_error": None, "exit_code": None, "attempts": 0, "next_run_at": T0})


def test_claim_without_returning_fallback(sqlite_store, monkeypatch):
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)
    register(sqlite_store)
    sqlite_store.enqueue([spec("a")], T0)
    job = sqlite_store.claim("w1", T0)
    assert (job.id, job.state, job.worker_id) == ("a", "processing", "w1")
    assert sqlite_store.claim("w1", T0) is None


def test_claim_without_returning_fallback_serves_queues_and_promotes_due_jobs(sqlite_store, monkeypatch):
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)
    register(sqlite_store)
    sqlite_store.enqueue([spec("a", queue="alpha"), spec("b", queue="beta", priority=1),
                   spec("later", queue="alpha", priority=9, run_at=T0 + 5)], T0)
    sqlite_store.pause(["beta"])
    assert claim_ids(sqlite_store, T0, ("alpha", "beta")) == ["a"]
    assert claim_ids(sqlite_store, T0 + 5) == ["later"]
    sqlite_store.resume(["beta"])
    assert claim_ids(sqlite_store, T0 + 5, ("beta",)) == ["b"]


def test_a_failed_job_waits_out_its_backoff_before_it_is_claimed_again(store):
    register(store)
    store.enqueue([spec("f")], T0)
    finish_next(store, 1, T0)  # failed, retry due at T0 + 2 (backoff_base 2, attempt 1)
    assert store.get("f").state == "failed"
    assert not store.due_now(T0 + 1.9)
    assert store.claim("w1", T0 + 1.9) is None
    assert store.claim("w1", T0 + 2).id == "f"


def test_claim_and_poll_do_not_walk_paused_unserved_or_future_jobs(sqlite_store):
    # Counted in SQLite VM instructions, not seconds, so the test is exact on a loaded machine: a
    # claim that walked past the 30,000 jobs below would cost hundreds of thousands.
    register(sqlite_store)
    sqlite_store.enqueue([spec(f"p{i}", queue="backfill") for i in range(10_000)], T0)
    sqlite_store.enqueue([spec(f"x{i}", queue="elsewhere", priority=9) for i in range(10_000)], T0)
    sqlite_store.enqueue([spec(f"f{i}", priority=5, run_at=T0 + 86_400) for i in range(10_000)], T0)
    sqlite_store.pause(["backfill"])
    sqlite_store.enqueue([spec("due")], T0)
    mine = ("default", "backfill")
    assert _vm_steps(sqlite_store, lambda: sqlite_store.due_now(T0 + 1, mine)) < 50
    assert _vm_steps(sqlite_store, lambda: sqlite_store.burst_done(T0 + 1, mine)) < 50
    assert _vm_steps(sqlite_store, lambda: sqlite_store.next_due_at(T0 + 1)) < 50  # when the poller looks next
    assert sqlite_store.next_due_at(T0 + 1) == T0 + 86_400
    job = None

    def claim():
        nonlocal job
        job = sqlite_store.claim("w1", T0 + 1, mine)
    assert _vm_steps(sqlite_store, claim) < 50
    assert job.id == "due"
    assert _vm_steps(sqlite_store, lambda: sqlite_store.due_now(T0 + 1)) < 50  # all queues: one seek per queue
    assert sqlite_store.claim("w1", T0 + 1).id == "x0"


def test_unregistered_worker_cannot_claim(store):
    store.enqueue([spec("a")], T0)
    assert store.claim("ghost", T0) is None
    assert store.get("a").state == "pending"


def test_claim_from_many_threads_never_duplicates(tmp_path):
    path = str(tmp_path / "many.db")
    s = queuectl.SqliteStore(path)
    register(s)
    for i in range(200):
        s.enqueue([spec(f"j{i}")], T0)
    claimed, lock = [], threading.Lock()

    def grab():
        mine = queuectl.SqliteStore(path, durable=False, busy_deadline_s=30)
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


def test_a_run_that_ends_sees_to_its_dependents_and_limited_queue_alone(store, monkeypatch):
    """A finished run releases or kills its dependents and wakes the workers for a freed slot of a
    limited queue; a run without dependents in an unlimited queue wakes nobody (SQL_RUN_TIES's two answers)."""
    woken = []
    monkeypatch.setattr(store, "_wake_workers", lambda cur: woken.append(True))
    register(store)
    store.set_limit("solo", 1)
    store.enqueue([spec("a", queue="solo"), spec("b", depends_on=["a"], priority=5), spec("c", max_retries=0),
                   spec("d", depends_on=["c"]), spec("e", run_at=T0 + 3600), spec("f", depends_on=["e"])], T0)
    woken.clear()
    job = store.claim("w1", T0, ("solo",))
    assert store.finish(job, "w1", outcome(), SETTINGS, T0 + 1).state == "completed"
    assert store.get("b").waiting_on == 0 and woken  # released, and the slot freed
    woken.clear()
    job = store.claim("w1", T0 + 1, ("default",))
    assert job.id == "b" and store.finish(job, "w1", outcome(), SETTINGS, T0 + 2).state == "completed"
    assert not woken  # nothing depends on b, and its queue has no limit
    job = store.claim("w1", T0 + 2)
    assert job.id == "c" and store.finish(job, "w1", outcome(1, "boom"), SETTINGS, T0 + 3).state == "dead"
    assert (store.get("d").state, store.get("d").last_error) == ("dead", "dependency c is dead")
    job = store.claim("w1", T0 + 3600)
    assert job.id == "e" and store.interrupt(job, "w1", LOST, False, T0 + 3601) == "pending"
    assert (store.get("f").state, store.get("f").waiting_on) == ("pending", 1) and woken  # requeued: runs again


def test_a_death_without_dependents_wakes_the_workers_for_its_notification_job(store, monkeypatch):
    """A run that ends its job dead makes a notification job when on_dead is set (see migration 6): the
    workers are woken for it though nothing depends on the job and its queue has no limit; without
    on_dead a death wakes nobody."""
    woken = []
    monkeypatch.setattr(store, "_wake_workers", lambda cur: woken.append(True))
    register(store)
    store.enqueue([spec("quiet", max_retries=0), spec("told", max_retries=0, on_dead="true")], T0)
    for job_id, expected in (("quiet", []), ("told", [True])):
        woken.clear()
        job = store.claim("w1", T0)
        assert job.id == job_id and store.finish(job, "w1", outcome(1, "boom"), SETTINGS, T0 + 1).state == "dead"
        assert woken == expected, job_id


@pytest.mark.parametrize("how", ["canceled", "stuck", "lost too often"])
def test_an_interrupted_run_that_sends_its_job_to_the_dlq_takes_its_dependents_and_frees_its_slot(store, monkeypatch, how):
    """interrupt() sees to a run's ties as a result does (Store._after_run): a cancel, a leftover process,
    or the lost-worker cap send the job to the DLQ, and its dependents with it, and a slot of its
    limited queue is freed (the workers woken)."""
    woken = []
    register(store)
    store.set_limit("solo", 1)
    store.enqueue([spec("a", queue="solo"), spec("b", depends_on=["a"]), spec("c", depends_on=["b"])], T0)
    job = store.claim("w1", T0)
    if how == "canceled":
        store.cancel(["a"], T0 + 1)
    job.lost_count = queuectl.LOST_WORKER_CAP - 1 if how == "lost too often" else 0
    monkeypatch.setattr(store, "_wake_workers", lambda cur: woken.append(True))
    stuck = "a process of the run could not be killed" if how == "stuck" else None
    end = LOST if how == "lost too often" else queuectl.Outcome(None, "canceled", None, 0.1, interrupted="canceled")
    assert store.interrupt(job, "w1", end, how == "lost too often", T0 + 2, stuck=stuck) == "dead"
    assert [(j.id, j.state, j.last_error) for j in store.list_jobs()][1:] == [
        ("b", "dead", "dependency a is dead"), ("c", "dead", "dependency b is dead")]
    assert woken  # a's slot of `solo` is free


def test_a_result_without_dependents_or_a_job_falling_due_runs_no_update_for_them(sqlite_store):
    """The result-and-claim transaction runs the dependents' update only for a job something depends
    on, and the promotion only when a staged job has fallen due: on SQLite each builds a temporary
    table, a share of every short job's cost when most jobs need neither."""
    register(sqlite_store)
    sqlite_store.enqueue([spec("a"), spec("b"), spec("c", depends_on=["b"]), spec("later", run_at=T0 + 60)], T0)
    sql = sqlite_store.sql
    ran = []
    sqlite_store.conn.set_trace_callback(ran.append)

    def result_and_claim(job, now):
        ran.clear()
        return sqlite_store.finish_and_claim(job, "w1", outcome(), SETTINGS, now, ())[1]
    try:
        job = result_and_claim(sqlite_store.claim("w1", T0), T0 + 1)
        assert job.id == "b"
        assert not any(s.startswith(("UPDATE jobs SET waiting_on", "UPDATE jobs SET ready")) for s in ran), ran
        # An UPDATE of jobs is traced twice, once more as its trigger's program starts (jobs_dead, whose
        # WHEN lets it do nothing unless the job died): the statements are the distinct ones in a row.
        ran[:] = [s for n, s in enumerate(ran) if n == 0 or s != ran[n - 1]]
        assert len(ran) == 8, ran  # BEGIN, the job, its run, its ties, any staged due, the claim, the run, COMMIT
        job = result_and_claim(job, T0 + 61)  # b releases c; `later` has fallen due
        assert any(s.startswith("UPDATE jobs SET waiting_on") for s in ran)
        assert any(s.startswith("UPDATE jobs SET ready") for s in ran) and job.id in ("c", "later")
    finally:
        sqlite_store.conn.set_trace_callback(None)
    assert sql.SQL_RUN_TIES and sqlite_store.get("c").waiting_on == 0


def test_the_claims_choice_builds_no_temporary_index_for_pauses_or_queue_heads(sqlite_store):
    """SQL_NEXT_DUE runs in every claim and poll: SQLite builds a temporary index at each run for an IN
    list with a column in it and for `IN (subquery)`, so the pause checks are equalities and the heads
    a join. What is left: the skip-scan's queue of queues, its union, and the sort of the heads."""
    plan = sqlite_store.conn.execute("EXPLAIN " + sqlite_store.sql.SQL_NEXT_DUE, {"now": T0, "queues": None}).fetchall()
    assert sum(1 for row in plan if row[1] == "OpenEphemeral") <= 3


def _claims_choice_by_hand(conn, now, queues):
    """The job SQL_NEXT_DUE must choose, computed in Python from the rows: ready and due, in a served
    queue that is neither paused (by name or '*', unless resumed alone by '!name') nor at its limit."""
    paused = {r[0] for r in conn.execute("SELECT queue FROM paused")}
    limits = dict(conn.execute("SELECT queue, max_running FROM queue_limits"))
    running = collections.Counter(r[0] for r in conn.execute("SELECT queue FROM jobs WHERE state = 'processing'"))
    rows = conn.execute("SELECT id, queue, priority, next_run_at, seq FROM jobs WHERE state IN ('pending', 'failed') "
                        "AND waiting_on = 0 AND ready = 1 AND next_run_at <= ?", (now,)).fetchall()
    best = [(-priority, due, seq, job_id) for job_id, queue, priority, due, seq in rows
            if (queues is None or queue in queues) and ("!" + queue in paused or not {queue, "*"} & paused)
            and running[queue] < limits.get(queue, math.inf)]
    return min(best)[3] if best else None


def test_the_claims_choice_is_the_best_ready_job_of_a_served_queue_neither_paused_nor_full(sqlite_store):
    """SQL_NEXT_DUE against a by-hand choice over random small queues (seeded): any mix of pauses
    ('*', names, '!name', even rows the commands never leave together), limits full or free, priorities,
    due times, staged and waiting jobs, and the served queues NULL or a list (duplicates, unknown names)."""
    rng, names = random.Random(25), ["a", "b", "c", "d"]
    sql, conn = sqlite_store.sql, sqlite_store.conn
    register(sqlite_store)
    for case in range(150):
        with conn:
            for table in ("jobs", "paused", "queue_limits"):
                conn.execute(f"DELETE FROM {table}")
        sqlite_store.enqueue([spec(f"j{case}-{n}", queue=rng.choice(names), priority=rng.choice([0, 0, 0, 1, 5]))
                              for n in range(rng.randint(0, 12))], T0)
        with conn:
            for (job_id,) in conn.execute("SELECT id FROM jobs").fetchall():
                conn.execute("UPDATE jobs SET state = ?, ready = ?, waiting_on = ?, next_run_at = ? WHERE id = ?",
                             (rng.choice(["pending", "pending", "failed", "processing", "completed", "dead"]),
                              rng.choice([1, 1, 1, 0]), rng.choice([0, 0, 0, 1]), T0 + rng.randint(-20, 2),
                              job_id))
            conn.executemany("INSERT INTO paused VALUES (?)", [(q,) for q in names + ["*"] + ["!" + n for n in names]
                                                               if rng.random() < 0.2])
            conn.executemany("INSERT INTO queue_limits VALUES (?, ?)",
                             [(q, rng.randint(1, 3)) for q in names if rng.random() < 0.3])
        for queues in (None, tuple(rng.sample(names + ["zz", "a"], rng.randint(1, 3)))):
            params = {"now": T0, "queues": None if queues is None else json.dumps(queues)}
            chosen = conn.execute(sql.SQL_NEXT_DUE, params).fetchone()
            assert (chosen and chosen[0]) == _claims_choice_by_hand(conn, T0, queues), (case, queues)


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
    assert store.request_stop(["w1"]) == ["w1"]
    assert store.heartbeat("w1", T0 + 2) is True
    store.deregister("w1")
    assert store.heartbeat("w1", T0 + 3) is None


def test_postgres_a_heartbeat_that_waited_too_long_for_a_lock_runs_again_and_beats_once(pg_url):
    """PostgreSQL's heartbeat is one statement, its own transaction: one that met lock_timeout was rolled back
    on its own, and runs again (as a transaction would) until the lock is gone; the beat counts once."""
    import psycopg
    with contextlib.closing(queuectl.PostgresStore(pg_url, busy_deadline_s=WAIT_S)) as s, \
            psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as locker:
        register(s)
        beat = s.workers()[0].beat
        locker.execute(f'SET search_path TO "{s.schema}"')
        locker.execute("BEGIN")
        locker.execute("SELECT 1 FROM workers WHERE id = 'w1' FOR UPDATE")
        write, tries = s.write, []

        def counted(fn, **kwargs):
            def attempt(cur):
                tries.append(1)
                if len(tries) == 2:  # the first met the lock's timeout: let this one through
                    locker.execute("COMMIT")
                return fn(cur)
            return write(attempt, **kwargs)
        s.write = counted
        assert s.heartbeat("w1", T0 + 1) is False
        assert len(tries) == 2 and s.workers()[0].beat == beat + 1


def test_burst_done(store):
    assert store.burst_done(T0)
    store.enqueue([spec("soon", run_at=T0 + 30)], T0)
    assert not store.burst_done(T0)  # due within the horizon
    assert store.burst_done(T0 - 100)  # due later than the horizon
    store.enqueue([spec("now", queue="q2")], T0)
    assert not store.burst_done(T0, ("q2",))  # ready now
    store.pause(["q2"])
    assert store.burst_done(T0, ("q2",))  # a paused queue's jobs do not hold a burst


@pytest.mark.parametrize("queues", [(), ("mine",)])
@pytest.mark.parametrize("reads_before", [1, 2, 3])
@pytest.mark.parametrize("check", ["due_now", "burst_done"])
def test_poll_and_burst_find_a_job_promoted_between_their_reads(sqlite_store, monkeypatch, check, reads_before, queues):
    # SQLite's poll and burst check are several reads, each its own snapshot; another worker's claim
    # may promote a staged job (staged -> ready) between two of them. Whichever read it follows, the
    # job is found: a burst worker that missed it would leave it behind.
    register(sqlite_store)
    register(sqlite_store, "w2")
    sqlite_store.enqueue([spec("x", queue="mine", run_at=T0 + 5)], T0)
    read, reads = sqlite_store.read, []

    def read_then_claim_elsewhere(sql, params=()):
        rows = read(sql, params)
        reads.append(sql)
        if len(reads) == reads_before:
            assert sqlite_store.claim("w2", T0 + 5, ("elsewhere",)) is None  # promotes x, takes nothing
        return rows
    monkeypatch.setattr(sqlite_store, "read", read_then_claim_elsewhere)
    found = sqlite_store.due_now(T0 + 5, queues) if check == "due_now" else not sqlite_store.burst_done(T0 + 5, queues)
    assert found
    assert sqlite_store.get("x").state == "pending"  # nobody took it


# ---- the database file: permissions, foreign and damaged files, read-only use --------------------

def folder_state(folder):
    """What a command that only reads must leave as it was: the folder's listing and mtime, and each
    file's bytes and mtime."""
    files = sorted((entry.name, open(entry.path, "rb").read(), entry.stat().st_mtime_ns)
                   for entry in os.scandir(folder))
    return os.stat(folder).st_mtime_ns, files


def _foreign_db(path):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE foo (x TEXT)")
    conn.execute("INSERT INTO foo VALUES ('mine')")
    conn.commit()
    conn.close()
    with open(path, "rb") as f:
        return f.read()


def run_as_reader(db, *args, popen=False):
    """queuectl as a user who may read `db` but not write it or its folder (see read_only_db): root
    without its capabilities, or ourselves once the write bits are gone."""
    options = {"preexec_fn": _without_capabilities()} if os.geteuid() == 0 else {}
    argv = [sys.executable, QUEUECTL, "--db", db, *args]
    if popen:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env(), **options)
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT_S,
                          env=child_env(), **options)


@pytest.fixture
def read_only_db(tmp_path):
    """(folder, q.db, empty.db): q.db holds done (completed, printed "done"), gone (dead) and wait
    (pending); empty.db is an empty file, a database not set up yet. As root: the folder (0755) and
    files (0644) belong to nobody, and run_as_reader's root without capabilities is just another user;
    otherwise they are ours, without write bits (0555, 0444)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db, empty = str(folder / "q.db"), str(folder / "empty.db")
    now = time.time()
    with opened(db) as s:
        register(s, now=now)
        s.enqueue([spec("done", "echo done")], now)
        finish_next(s, 0, now, "done\n")
        s.enqueue([spec("gone", "exit 4", max_retries=0)], now)
        finish_next(s, 4, now, "oops\n")
        s.enqueue([spec("wait", "true")], now)
        s.deregister("w1")
    open(empty, "wb").close()
    root = os.geteuid() == 0
    for path, mode in ((db, 0o644), (empty, 0o644), (folder, 0o755)):
        if root:
            import pwd
            nobody = pwd.getpwnam("nobody")
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        os.chmod(path, mode if root else mode & 0o555)
    try:
        yield folder, db, empty
    finally:
        os.chmod(folder, 0o755)


def burst_log(workers, db):
    """The log of one burst worker on db (one job to run, so it also shows it ran)."""
    enqueue(db, command="true")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    assert "completed" in worker.log()
    return worker.log()


def test_new_database_is_0600_wal_and_versioned(tmp_path):
    path = tmp_path / "new.db"
    s = queuectl.SqliteStore(str(path))
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert s.read("PRAGMA journal_mode")[0][0] == "wal"
        assert s.read("PRAGMA user_version")[0][0] == queuectl.SCHEMA_VERSION
        assert s.read("PRAGMA application_id")[0][0] == queuectl.APPLICATION_ID
    finally:
        s.close()


def test_a_store_that_only_reads_opens_a_database_it_cannot_write_read_only(tmp_path, monkeypatch):
    path = str(tmp_path / "ro.db")
    with contextlib.closing(queuectl.SqliteStore(path)) as owner:
        owner.enqueue([spec("a")], T0)
    before = folder_state(tmp_path)
    monkeypatch.setattr(queuectl, "_writable", lambda p: False)  # as for a user who may only read it
    reader = queuectl.SqliteStore(path, reads_only=True)
    try:
        assert (reader.read_only, reader.frozen) == (True, True)  # no -wal: nobody has it open
        assert [j.id for j in reader.list_jobs()] == ["a"]
        with pytest.raises(sqlite3.OperationalError):
            reader.pause(["x"])
        assert folder_state(tmp_path) == before  # nothing written, no -wal or -shm made
        with contextlib.closing(queuectl.SqliteStore(path)) as owner:  # a writer starts meanwhile
            owner.enqueue([spec("b")], T0)
            reader.refresh()  # what a poll does: the frozen file is read again, now through the -wal
            assert (reader.read_only, reader.frozen) == (True, False)
            assert [j.id for j in reader.list_jobs()] == ["a", "b"]
    finally:
        reader.close()


def test_an_empty_file_made_by_the_user_becomes_a_0600_database(tmp_path):
    path = tmp_path / "made.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    queuectl.SqliteStore(str(path)).close()
    for name in (path, tmp_path / "made.db-wal", tmp_path / "made.db-shm"):
        if name.exists():
            assert stat.S_IMODE(name.stat().st_mode) == 0o600, name


def test_a_relative_db_in_a_deleted_folder_exits_1_with_a_clear_error(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    command = f"cd {shlex.quote(str(gone))} && rmdir ../gone && exec {shlex.quote(sys.executable)} " \
              f"{shlex.quote(QUEUECTL)} status"
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=child_env(),
                          timeout=WAIT_S)
    assert proc.returncode == 1
    assert_one_error(proc.stderr, "queuectl.db", "current folder no longer exists")


def test_db_file_is_created_with_mode_0600(sqlite_db):
    old_umask = os.umask(0o022)
    try:
        ok(sqlite_db, "enqueue", '{"command": "true"}')
    finally:
        os.umask(old_umask)
    assert os.stat(sqlite_db).st_mode & 0o777 == 0o600
    for suffix in ("-wal", "-shm"):
        if os.path.exists(sqlite_db + suffix):
            assert os.stat(sqlite_db + suffix).st_mode & 0o077 == 0, suffix


@pytest.mark.parametrize("args", DB_COMMANDS, ids=lambda args: "-".join(args[:2]))
def test_a_file_that_is_not_a_database_is_refused_untouched(sqlite_db, args):
    garbage = b"this is not a database\n\x00\xff" * 200
    with open(sqlite_db, "wb") as f:
        f.write(garbage)
    code, out, err = cli(sqlite_db, *args)
    assert (code, out) == (1, "")
    assert_one_error(err)
    with open(sqlite_db, "rb") as f:
        assert f.read() == garbage


@pytest.mark.parametrize("args", DB_COMMANDS, ids=lambda args: "-".join(args[:2]))
def test_another_apps_sqlite_db_is_refused_untouched(sqlite_db, args):
    before = _foreign_db(sqlite_db)
    code, out, err = cli(sqlite_db, *args)
    assert (code, out) == (1, "")
    assert_one_error(err)
    with open(sqlite_db, "rb") as f:
        assert f.read() == before
    assert not os.path.exists(sqlite_db + "-wal") or os.path.getsize(sqlite_db + "-wal") == 0


def test_database_errors_name_the_file_and_the_reason(tmp_path):
    folder = tmp_path / "a-folder.db"
    folder.mkdir()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database\n" * 200)
    missing = tmp_path / "no-such-folder" / "q.db"
    for path, reason in ((folder, "is a directory"), (garbage, "file is not a database"),
                         (missing, "no such file or directory")):
        for args in (("status",), ("enqueue", '{"command": "true"}')):
            if path == missing and args == ("status",):
                continue  # no file to read: an empty queue (test_commands_that_only_read_create_nothing)
            code, out, err = cli(str(path), *args)
            assert (code, out) == (1, ""), (path, args)
            assert_one_error(err, f"cannot open {path}: {reason}")
    assert garbage.read_bytes() == b"this is not a database\n" * 200
    assert os.listdir(folder) == [] and not missing.parent.exists()


READING_COMMANDS = (("status",), ("status", "--json"), ("list",), ("list", "--json"), ("stats", "--json"),
                    ("metrics",), ("queues",), ("queues", "--json"), ("worker", "list", "--json"),
                    ("schedule", "list"), ("schedule", "list", "--json"), ("dlq", "list", "--json"),
                    ("config", "list", "--json"), ("config", "get", "max-retries"), ("wait", "--all"))


def pg_schema_exists(url):
    """Whether the schema that a postgresql:// --db names exists on its server."""
    import psycopg
    libpq, schema = queuectl._pg_target(url)[:2]
    with psycopg.connect(libpq, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


def test_commands_that_only_read_create_nothing_and_answer_as_an_empty_queue(db, tmp_path, monkeypatch):
    """The wrong folder, or a typo in --db: a reading command creates no file (no schema, even one whose
    name needs quoting), prints what an empty queue prints and says on stderr where it looked."""
    if is_pg(db):
        db = db.replace("schema=t_", "schema=Team2_")  # the backend quotes it: "Team2_…"
        where = queuectl.database_name(db)
    else:
        db, where = "sub.db", str(tmp_path / "sub.db")
        monkeypatch.chdir(tmp_path)  # a relative --db: the note gives the absolute path
    try:
        missing = {args: cli(db, *args) for args in READING_COMMANDS}
        assert not (pg_schema_exists(db) if is_pg(db) else os.listdir(tmp_path))
        assert cli(db, "show", "x")[2] == f"queuectl: note: no queue at {where} yet\nqueuectl: error: no job with id 'x'\n"
        ok(db, "config", "set", "max-retries", "3")  # the queue now exists, and is empty
        for args, (code, out, err) in missing.items():
            assert (code, err) == (0, f"queuectl: note: no queue at {where} yet\n"), args
            assert cli(db, *args) == (0, out, ""), args
    finally:
        if is_pg(db):
            db_sql(db, f'DROP SCHEMA IF EXISTS "{queuectl._pg_target(db)[1]}" CASCADE')


def test_a_command_that_reads_creates_no_file_deleted_after_it_looked(sqlite_db, monkeypatch):
    """`rm queuectl.db` between a reader's look and its open: the reader still creates nothing."""
    ok(sqlite_db, "config", "set", "max-retries", "3")

    def deleted_meanwhile(path):  # asked between the look and the open
        for name in (path, f"{path}-wal", f"{path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)
        return True
    monkeypatch.setattr(queuectl, "_writable", deleted_meanwhile)
    code, out, err = cli(sqlite_db, "status", "--json")
    assert (code, err) == (0, f"queuectl: note: no queue at {sqlite_db} yet\n")
    assert json.loads(out)["jobs"]["pending"] == 0 and not os.path.exists(sqlite_db)


@sqlite_only
def test_a_file_that_is_no_queuectl_database_keeps_its_error_for_commands_that_read(db):
    data = _foreign_db(db)
    code, out, err = cli(db, "status")
    assert (code, out) == (1, "")
    assert_one_error(err, "is not a queuectl database")
    assert open(db, "rb").read() == data


def test_commands_that_only_read_work_on_a_database_this_user_cannot_write(read_only_db):
    folder, db, empty = read_only_db
    before = folder_state(folder)
    outputs = {}
    for args in (("status", "--json"), ("list", "--json"), ("show", "done", "--json"), ("logs", "done"),
                 ("stats", "--json"), ("dlq", "list", "--json"), ("worker", "list", "--json"),
                 ("config", "list", "--json"), ("config", "get", "max-retries"), ("wait", "done")):
        result = run_as_reader(db, *args)
        assert (result.returncode, result.stderr) == (0, ""), args
        outputs[args[0] if args[0] not in ("dlq", "worker", "config") else " ".join(args[:2])] = result.stdout
    assert json.loads(outputs["status"])["jobs"] == {"pending": 1, "processing": 0, "completed": 1, "failed": 0,
                                                     "dead": 1}
    assert [j["id"] for j in json.loads(outputs["list"])] == ["done", "gone", "wait"]
    assert json.loads(outputs["show"])["runs"][0]["output"] == outputs["logs"] == "done\n"
    assert json.loads(outputs["stats"])["runs"] == {"completed": 1, "failed": 0, "dead": 1}
    assert [j["id"] for j in json.loads(outputs["dlq list"])] == ["gone"]
    assert json.loads(outputs["worker list"]) == [] and outputs["config get"] == "3\n"

    dashboard = run_as_reader(db, "dashboard", "--port", "0", "--no-token", popen=True)
    try:
        url = dashboard.stdout.readline().strip()
        import urllib.request
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url + "api/status", timeout=30) as res:
            assert json.loads(res.read())["jobs"]["pending"] == 1
    finally:
        dashboard.send_signal(signal.SIGTERM)
        _, err = dashboard.communicate(timeout=WAIT_S)
    assert dashboard.returncode == 0 and "Traceback" not in err, err

    result = run_as_reader(db, "enqueue", '{"command": "true"}')  # a write is refused
    assert result.returncode == 1
    assert_one_error(result.stderr, f"cannot write {db}: permission denied")
    result = run_as_reader(empty, "status")  # a database not set up needs a writer
    assert result.returncode == 1
    import pwd
    assert_one_error(result.stderr, empty, "schema upgrade", f"owner ({pwd.getpwuid(os.stat(empty).st_uid).pw_name})",
                     "any user who can write it")
    assert folder_state(folder) == before

    if os.geteuid() == 0:  # a writer has it open meanwhile: the reader reads through its -wal and -shm,
        link = str(folder.parent / "link.db")  # also through a symlink (SQLite keeps them beside the target)
        os.symlink(db, link)
        with opened(db) as owner:
            owner.enqueue([spec("new")], time.time())
            for path in (db, link):
                result = run_as_reader(path, "list", "--json")
                assert result.returncode == 0, result.stderr
                assert [j["id"] for j in json.loads(result.stdout)] == ["done", "gone", "wait", "new"], path


def test_a_frozen_read_that_a_writer_touched_is_read_again(tmp_path, monkeypatch):
    """An immutable=1 read of a file a writer opened meanwhile may fail or mix pages: read again."""
    path = str(tmp_path / "f.db")
    with opened(path) as s:
        s.enqueue([spec("a")], T0)
    monkeypatch.setattr(queuectl, "_writable", lambda path: False)  # as for a user who may only read
    store = queuectl.SqliteStore(path, reads_only=True)
    try:
        assert store.frozen
        with opened(path) as writer:  # a writer appears: its -wal exists while it has the file open
            writer.enqueue([spec("b")], T0)
            assert [j.id for j in store.list_jobs()] == ["a", "b"]  # reopened with mode=ro, through the -wal
            assert not store.frozen
    finally:
        store.close()


def test_a_fifo_is_refused_as_a_database_at_once(tmp_path):
    fifo = str(tmp_path / "q.db")
    os.mkfifo(fifo)
    result = script(fifo, "status", timeout=30)
    assert result.returncode == 1
    assert_one_error(result.stderr, f"cannot open {fifo}: not a regular file")


def test_truncated_database_is_refused_and_left_untouched(tmp_path):
    path = str(tmp_path / "cut.db")
    for i in range(200):
        ok(path, "enqueue", json.dumps({"id": f"j{i}", "command": "echo " + "z" * 500}))
    ok(path, "status")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    before = open(path, "rb").read()
    for args in (("list",), ("status",), ("enqueue", '{"command": "true"}')):
        code, out, err = cli(path, *args)
        assert code == 1, (args, out, err)
        assert_one_error(err, "database")
    assert open(path, "rb").read() == before


def test_database_wal_and_shm_are_private_while_workers_run(sqlite_db, workers):
    worker = workers.start()
    worker.wait_log("worker started")
    wait_for(lambda: os.path.exists(sqlite_db + "-wal") and os.path.exists(sqlite_db + "-shm"), "the WAL files")
    for path in (sqlite_db, sqlite_db + "-wal", sqlite_db + "-shm"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_a_worker_warns_when_others_can_write_its_database_file(sqlite_db, workers):
    import grp
    enqueue(sqlite_db, command="true")  # creates it, 0600
    assert OTHER_WRITERS not in burst_log(workers, sqlite_db)  # a private file: nothing to say
    os.chmod(sqlite_db, 0o660)  # a group-shared queue: still runs, but says who chooses its commands
    group = grp.getgrgid(os.stat(sqlite_db).st_gid).gr_name
    log = burst_log(workers, sqlite_db)
    assert f"the database {sqlite_db} is writable by group {group}: {OTHER_WRITERS}" in log
    os.chmod(sqlite_db, 0o606)
    assert f"is writable by every user: {OTHER_WRITERS}" in burst_log(workers, sqlite_db)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_worker_run_as_root_warns_on_a_database_another_user_owns(sqlite_db, workers):
    import pwd
    enqueue(sqlite_db, command="true")
    other = pwd.getpwnam("nobody")
    os.chown(sqlite_db, other.pw_uid, -1)  # mode 0600: only its owner (and root) can write it
    log = burst_log(workers, sqlite_db)
    assert f"worker runs as root, but the database {sqlite_db} is owned by nobody: {OTHER_WRITERS} root runs" in log


def test_other_writers_names_each_reason_and_is_silent_for_a_private_file():
    import pwd

    def st(uid, gid, mode):
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))
    me = os.geteuid()
    assert queuectl.other_writers("/q.db", st(me, 0, 0o600), me) is None
    assert queuectl.other_writers("/q.db", st(me, 0, 0o640), me) is None  # others may read: not write
    note = queuectl.other_writers("/q.db", st(4242424, 4242424, 0o662), me)  # ids no one here has
    assert note.endswith("the database /q.db is owned by 4242424 and writable by group 4242424 and writable by "
                         f"every user: {OTHER_WRITERS} {pwd.getpwuid(me).pw_name} runs")


def test_a_database_made_through_a_dangling_symlink_is_private_from_the_start(tmp_path, monkeypatch):
    """`--db link` to a file not made yet: the O_EXCL create of the link failed (the link exists), so
    SQLite created the target with the umask's mode (0644 here) and others could open it before it was
    narrowed. The target is created 0600 first (the later narrowing is switched off to see that)."""
    monkeypatch.setattr(queuectl, "_make_private", lambda path: None)
    target, link = tmp_path / "real.db", tmp_path / "link.db"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        ok(str(link), "config", "set", "max-retries", "3")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


def test_a_database_made_under_a_umask_without_the_owners_write_bit_works(tmp_path):
    """umask 0277 took the owner's write bit from the new file: the command failed and left an empty
    0400 file, which every later command took for a database to upgrade."""
    path = str(tmp_path / "q.db")
    old = os.umask(0o277)
    try:
        enqueue(path, id="a", command="true")
    finally:
        os.umask(old)
    assert state_of(path, "a") == "pending"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


# ---- a busy, full or unwritable database ---------------------------------------------------------

class RollbackFailsOnce:
    """A Store's connection (a thin proxy) whose next rollback fails and leaves the transaction open, as a
    ROLLBACK that fails does: SQLite's raises (an I/O error, a signal); psycopg logs a failed one and goes
    on. SQLite's Store calls rollback(); PostgreSQL's, psycopg's transaction() or a ROLLBACK statement."""

    def __init__(self, conn):
        self.real, self.failed = conn, False

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _fail_once(self) -> bool:
        failing, self.failed = not self.failed, True
        return failing

    def rollback(self):
        if self._fail_once():
            raise sqlite3.OperationalError("disk I/O error")
        self.real.rollback()

    def execute(self, sql, *args, **kwargs):
        if sql == "ROLLBACK" and self._fail_once():
            import psycopg
            raise psycopg.OperationalError("the ROLLBACK failed")
        return self.real.execute(sql, *args, **kwargs)

    @contextlib.contextmanager
    def transaction(self):
        if self.failed:
            with self.real.transaction():
                yield
            return
        self.real.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.failed = True  # no ROLLBACK: psycopg's failed, and it only logged that
            raise
        self.real.execute("COMMIT")


def limited_fsize(max_bytes):
    """preexec_fn: the child may not grow any file past max_bytes (writes then fail with EFBIG)."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def test_a_write_whose_rollback_fails_is_never_committed_and_the_store_goes_on(store):
    """A failed ROLLBACK left the connection in the transaction. SQLite's held the file's write lock, and
    every later BEGIN was refused: a worker's runners, which share the connection, wedged, and every other
    process found the queue busy. PostgreSQL's next writes only opened savepoints in it, reported done but
    not committed, until a pipelined enqueue's COMMIT committed them with the half-done write."""
    store.enqueue([spec("a")], T0)
    faulty = store.conn = RollbackFailsOnce(store.conn)

    def half_done(cur):
        cur.execute(store.sql.SQL_CONFIG_SET, ("max_retries", "9"))
        raise queuectl.BadDatabase("the disk is full")  # as a transaction's next statement may fail
    with pytest.raises(queuectl.BadDatabase, match="disk is full"):
        store.write(half_done)
    assert faulty.failed
    store.config_set("backoff_base", 5)
    store.enqueue([spec("b")], T0)  # pipelined on PostgreSQL: its own BEGIN and COMMIT
    with contextlib.closing(queuectl.open_database(store.target)) as other:
        assert [job.id for job in other.list_jobs()] == ["a", "b"]
        settings = other.config_all()
        assert (settings["max_retries"], settings["backoff_base"]) == (queuectl.CONFIG["max_retries"][0], 5)


def test_an_enqueue_refused_while_its_rollback_fails_stores_none_of_its_jobs(store):
    """The same through a real refusal: a batch whose second id is taken, refused after its first job was
    inserted (its savepoint undoes that insert; on PostgreSQL the ROLLBACK that fails is the pipelined
    enqueue's own statement). On SQLite every later write was refused."""
    store.enqueue([spec("a")], T0)
    faulty = store.conn = RollbackFailsOnce(store.conn)
    with pytest.raises(queuectl.Conflict, match="already exists"):
        store.enqueue([spec("c"), spec("a", command="echo again")], T0)
    assert faulty.failed
    store.enqueue([spec("b")], T0)
    with contextlib.closing(queuectl.open_database(store.target)) as other:
        assert [(job.id, job.command) for job in other.list_jobs()] == [("a", "true"), ("b", "true")]


def test_a_shared_sqlite_connection_whose_rollback_failed_is_opened_again_for_every_runner(sqlite_db):
    """A worker's runners share one connection: after one runner's half-done claim fails to roll back,
    another runner sees the job unclaimed and claims it. The connection is opened again as it was (a
    worker's synchronous=NORMAL), in the turn the failed write holds (taken again to read while opening)."""
    shared = queuectl.SqliteStore(sqlite_db, durable=False, shared=True)
    try:
        shared.enqueue([spec("a")], T0)
        register(shared)
        faulty = shared.conn = RollbackFailsOnce(shared.conn)

        def half_done(cur):
            assert shared._claim_in(cur, "w1", T0, ()).id == "a"
            raise queuectl.BadDatabase("the disk is full")
        failures = []

        def runner():
            try:
                shared.write(half_done)
            except queuectl.BadDatabase as e:
                failures.append(e)
        thread = threading.Thread(target=runner)
        thread.start()
        thread.join(WAIT_S)
        assert faulty.failed and len(failures) == 1 and shared.conn is not faulty
        assert shared.get("a").state == "pending"
        assert shared.claim("w1", T0).id == "a"
        assert shared.read("PRAGMA synchronous") == [(1,)]  # NORMAL
    finally:
        shared.close()


def test_busy_database_fails_enqueue_but_not_the_running_worker(sqlite_db, workers, tmp_path):
    done = tmp_path / "done"
    enqueue(sqlite_db, id="slow", command=f"sleep 1; touch {done}")
    worker = workers.start()
    wait_for(lambda: state_of(sqlite_db, "slow") == "processing", "the job to start")
    holder = hold_write_lock(sqlite_db)
    try:
        result = script(sqlite_db, "enqueue", '{"id": "blocked", "command": "true"}')
        assert result.returncode == 1 and result.stdout == ""
        assert_one_error(result.stderr, "database is busy")
    finally:
        holder.stdin.close()  # the lock is released once enqueue has given up
        holder.wait()
        holder.stdout.close()
    wait_for(lambda: state_of(sqlite_db, "slow") == "completed", "the job to be recorded after the lock")
    assert done.exists() and worker.popen.poll() is None
    assert "Traceback" not in worker.log()
    assert [j["id"] for j in json.loads(ok(sqlite_db, "list", "--json"))] == ["slow"]  # nothing half-stored


def test_full_disk_on_enqueue_is_a_clear_error_and_stores_nothing(sqlite_db):
    ok(sqlite_db, "enqueue", '{"id": "before", "command": "true"}')
    ok(sqlite_db, "status")  # last connection closed: the WAL is checkpointed away
    size = os.path.getsize(sqlite_db)
    batch = "".join(json.dumps({"command": "echo " + "x" * 60000}) + "\n" for _ in range(40)).encode()
    result = subprocess.run([sys.executable, QUEUECTL, "--db", sqlite_db, "enqueue", "-"], input=batch,
                            capture_output=True, env=child_env(), preexec_fn=limited_fsize(size + 64 * 1024))
    assert result.returncode == 1 and result.stdout == b""
    assert "Traceback" not in result.stderr.decode()
    assert len(result.stderr.decode().strip().splitlines()) == 1
    assert sql(sqlite_db, "PRAGMA integrity_check") == [("ok",)]
    assert list_ids(sqlite_db) == ["before"]
    ok(sqlite_db, "enqueue", '{"id": "after", "command": "true"}')  # space is back: work resumes
    assert list_ids(sqlite_db) == ["before", "after"]


def test_a_result_that_cannot_be_written_is_kept_and_retried(sqlite_db, workers, tmp_path):
    """The database refuses the worker's write after the command ran (file-size limit); once it
    accepts writes again the worker records the result: the job is neither lost nor recorded wrong."""
    import resource
    ok(sqlite_db, "status")
    pool_env = child_env(**{TAG_VAR: workers.tag})
    log_path = tmp_path / "limited.stderr"
    with open(log_path, "wb") as err:
        popen = subprocess.Popen([sys.executable, QUEUECTL, "--db", sqlite_db, "worker", "start"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, env=pool_env, start_new_session=True)
    worker = WorkerProc(popen, log_path)
    workers.procs.append(worker)
    worker.wait_log("worker started")
    # From now on the worker cannot grow any file: its result write must fail.
    limit = max(os.path.getsize(sqlite_db), os.path.getsize(sqlite_db + "-wal")) + 4096
    resource.prlimit(popen.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    enqueue(sqlite_db, id="big", command="head -c 200000 /dev/zero | tr '\\0' y; echo END")
    worker.wait_log("recording the result of job big failed")
    assert state_of(sqlite_db, "big") == "processing"
    resource.prlimit(popen.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    wait_for(lambda: state_of(sqlite_db, "big") == "completed", "the kept result to be written")
    job = get_job(sqlite_db, "big")
    assert job["attempts"] == 0 and job["run_count"] == 1 and job["output"].endswith("yEND\n")
    assert sql(sqlite_db, "PRAGMA integrity_check") == [("ok",)]


# ---- upgrades: schema versions, and workers of an older or newer schema --------------------------

@contextlib.contextmanager
def previous_schema(monkeypatch):
    """This queuectl as the previous one was: schema 4, whose worker rows record no version."""
    with monkeypatch.context() as m:
        m.setattr(queuectl, "SCHEMA_VERSION", 4)
        m.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:4])
        m.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:4])
        yield


def register_older(store, worker_id, identity, heartbeat_at):
    """Register a worker row as the previous queuectl wrote it (no version), in `store`'s dialect."""
    row = (worker_id, identity["host"], identity["pid"], identity["proc_start"], identity["boot_id"],
           identity["pid_ns"], heartbeat_at, heartbeat_at)
    store.write(lambda cur: cur.execute(OLDER_REGISTER.replace("?", store.sql.PARAM), row))


def set_schema_version(db, version):
    """Write the schema version straight into the database, as a newer queuectl's migration would."""
    if is_pg(db):
        import psycopg
        url, schema = db.rsplit("schema=", 1)
        with psycopg.connect(url[:-1], autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".queuectl_version SET version = %s', (version,))
    else:
        sql(db, f"PRAGMA user_version = {version}")


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "future.db"
    queuectl.SqliteStore(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {queuectl.SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(queuectl.BadDatabase, match="newer"):
        queuectl.SqliteStore(str(path))
    assert path.read_bytes() == before


def test_a_db_with_a_newer_schema_is_refused_untouched(sqlite_db):
    enqueue(sqlite_db, id="old", command="true")
    conn = sqlite3.connect(sqlite_db)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute(f"PRAGMA user_version = {version + 1000}")
    conn.commit()
    conn.close()
    with open(sqlite_db, "rb") as f:
        before = f.read()
    for args in DB_COMMANDS:
        code, out, err = cli(sqlite_db, *args)
        assert (code, out) == (1, ""), args
        assert_one_error(err)
    with open(sqlite_db, "rb") as f:
        assert f.read() == before


def test_a_version_1_database_upgrades_to_record_worker_queues(db, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:1])
        m.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:1])
        m.setattr(queuectl, "SCHEMA_VERSION", 1)
        with opened(db) as s:
            enqueue_older(s, "old", now=s.now())
    with opened(db) as s:
        version = "SELECT version FROM queuectl_version" if is_pg(db) else "PRAGMA user_version"
        assert s.read(version)[0][0] == queuectl.SCHEMA_VERSION >= 4
        s.register("w", queuectl.host_identity(), 1, s.now(), ("q",))
        assert s.workers()[0].queues == '["q"]' and s.get("old").state == "pending"


def test_an_upgrade_is_refused_while_workers_of_the_older_schema_are_alive_and_changes_nothing(db, monkeypatch):
    """A rolling upgrade: the previous queuectl's workers serve the queue (one on this host, alive by its PID;
    one on another host, by its fresh heartbeat; one here whose process is gone). Any command of this version
    would upgrade the schema under them: it refuses, naming the live ones, and leaves the database as it was."""
    me = queuectl.host_identity()
    ended = subprocess.Popen(["true"])
    ended.wait()
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            here = {**me, "pid": sleeper.pid, "proc_start": queuectl.proc_start_time(sleeper.pid)}
            elsewhere = {"host": "old-host", "pid": 4242, "proc_start": "1", "boot_id": "b", "pid_ns": "n"}
            with previous_schema(monkeypatch), opened(db) as s:
                enqueue_older(s, "old", queue="deploy", now=s.now())
                register_older(s, "here", here, s.now())
                register_older(s, "elsewhere", elsewhere, s.now())
                register_older(s, "gone", {**me, "pid": ended.pid, "proc_start": "0"}, s.now())
            before = dump(db)
            for args in (("status",), ("limit", "deploy", "1"), ("worker", "list", "--json")):
                code, out, err = cli(db, *args)
                assert (code, out) == (1, ""), (args, code, out, err)
                assert_one_error(err, "schema 4", f"{me['host']} PID {sleeper.pid} (queuectl 1.0.0",
                                 "old-host PID 4242 (queuectl 1.0.0", "worker stop", queuectl.__version__)
                assert f"{me['host']} PID {ended.pid} " not in err
            started = script(db, "worker", "start", "--burst")  # a worker of the new version does not start either
            assert started.returncode == 1 and "old-host PID 4242" in started.stderr, started.stderr
            assert dump(db) == before
        finally:
            sleeper.kill()
            sleeper.wait()
    # Both gone (the other host's heartbeat stale): the next command upgrades, and keeps the queue.
    with previous_schema(monkeypatch), opened(db) as s:
        s.write(lambda cur: cur.execute(f"UPDATE workers SET heartbeat_at = {s.sql.PARAM}", (s.now() - 3600,)))
    ok(db, "limit", "deploy", "1")
    assert get_job(db, "old")["state"] == "pending"
    with opened(db) as s:
        assert s.schema_version() == queuectl.SCHEMA_VERSION


def test_postgres_a_role_that_may_only_read_an_older_schema_is_told_its_owner_upgrades_it(pg_roles, monkeypatch):
    """As a read-only file needing an upgrade: the reader is told who can upgrade it, not warned off the owner's
    schema as if it were about to write there, and nothing is changed."""
    team, carol = pg_roles.make("team", "LOGIN"), pg_roles.make("carol", "LOGIN")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {team}")
    with previous_schema(monkeypatch), opened(pg_roles.url(team, schema)) as s:
        enqueue_older(s, "old", now=s.now())
    pg_roles.sql(f"GRANT USAGE ON SCHEMA {schema} TO {carol}", f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {carol}")
    for args in (("status",), ("list", "--json")):
        code, out, err = cli(pg_roles.url(carol, schema), *args)
        assert (code, out) == (1, ""), args
        assert_one_error(err, "schema upgrade (version 4 to", f"owner ({team})", "any queuectl command that writes")
    with opened(pg_roles.url(team, schema)) as s:  # its owner upgrades it, and then carol reads it
        assert s.read("SELECT version FROM queuectl_version")[0][0] == queuectl.SCHEMA_VERSION
    assert [j["id"] for j in json.loads(ok(pg_roles.url(carol, schema), "list", "--json"))] == ["old"]


def test_after_an_upgrade_an_older_worker_cannot_register(db, monkeypatch):
    """A worker of the previous queuectl that opened the database just before the upgrade, and registers just
    after it, is refused: it would claim by the older schema's rules."""
    with previous_schema(monkeypatch):
        older = queuectl.open_database(db)
    with contextlib.closing(older):
        ok(db, "status")  # this version upgrades the schema meanwhile
        with pytest.raises((queuectl.QueueError, sqlite3.Error)):
            register_older(older, "late", queuectl.host_identity(), older.now())
    assert json.loads(ok(db, "worker", "list", "--json")) == []


def test_postgres_an_upgrade_waits_for_a_registration_under_way_and_then_refuses(pg_url, monkeypatch):
    """The check for live older workers and the migration are one transaction, which takes the workers table
    first: a registration not yet committed when the command starts is waited for and seen."""
    import psycopg
    with previous_schema(monkeypatch), opened(pg_url) as s:
        enqueue_older(s, "old", now=s.now())
    url, schema = pg_url.rsplit("schema=", 1)
    with psycopg.connect(url[:-1]) as registering:  # a transaction: the INSERT waits for its commit
        registering.execute(f'SET search_path = "{schema}"')
        me = queuectl.host_identity()
        registering.execute(OLDER_REGISTER.replace("?", "%s"), ("older", me["host"], me["pid"], me["proc_start"],
                                                                me["boot_id"], me["pid_ns"], time.time(), time.time()))
        result = {}
        command = threading.Thread(target=lambda: result.update(zip(("code", "out", "err"), cli(pg_url, "status"))))
        command.start()
        try:
            with psycopg.connect(url[:-1], autocommit=True) as watcher:
                waiting = ("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                           (f'"{schema}".workers',))
                wait_for(lambda: watcher.execute(*waiting).fetchone()[0], "the command to wait for the registration")
            registering.commit()
        finally:
            command.join(WAIT_S)
    assert result["code"] == 1, result
    assert_one_error(result["err"], f"PID {me['pid']} (queuectl 1.0.0")


def test_worker_stop_reaches_the_workers_though_an_older_workers_row_outlived_the_upgrade(db, monkeypatch):
    """An upgrade run on another host found the older worker dead (no heartbeat for stale-timeout: a network
    cut), so its row, which records no version, stayed; on its own host `worker stop` finds it alive by its PID.
    The older worker can no longer beat (PostgreSQL refuses any write of a row without a version, so it cannot
    see a stop request either): asking it must not fail the request to every other worker."""
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            me = queuectl.host_identity()
            with previous_schema(monkeypatch), opened(db) as s:
                register_older(s, "older", {**me, "pid": sleeper.pid,
                                            "proc_start": queuectl.proc_start_time(sleeper.pid)}, s.now() - 3600)
            with monkeypatch.context() as m:  # the upgrading host judges it by its heartbeat: dead
                m.setattr(queuectl, "looks_alive", lambda *args: False)
                ok(db, "status")
            if is_pg(db):  # nor is it waited for, in vain (for ever, or until --timeout and exit 1)
                assert ok(db, "worker", "stop", "--wait", "--timeout", "20") == "asked 0 workers to stop\n"
            with opened(db) as s:
                s.register("newer", me, 1, s.now())
            code, out, err = cli(db, "worker", "stop")
            assert code == 0 and "Traceback" not in err, (code, out, err)
            with opened(db) as s:
                assert {w.id: w.stop_requested for w in s.workers()}["newer"] == 1
        finally:
            sleeper.kill()
            sleeper.wait()


def test_a_worker_leaves_a_database_a_newer_queuectl_upgraded(db, workers, tmp_path):
    """Should a newer queuectl upgrade the schema under a live worker anyway, the worker sees it at its next
    heartbeat: it claims nothing more, lets its running job finish, says why, and exits 1."""
    ok(db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    enqueue(db, id="late", command="true")  # the worker's one thread is busy: it stays pending
    set_schema_version(db, queuectl.SCHEMA_VERSION + 1)
    try:
        worker.wait_log(f"upgraded to schema {queuectl.SCHEMA_VERSION + 1}")
        assert worker.popen.poll() is None  # its job still runs
        (tmp_path / "release").touch()
        assert worker.wait() == 1, worker.log()
    finally:
        set_schema_version(db, queuectl.SCHEMA_VERSION)
    assert "start workers of the new version" in worker.log() and "job late claimed" not in worker.log()
    assert (get_job(db, "run")["state"], get_job(db, "late")["state"]) == ("completed", "pending")


def test_a_worker_leaves_a_database_whose_wal_and_shm_were_deleted(sqlite_db, workers, tmp_path):
    """`rm queue.db-wal queue.db-shm` (taken for leftovers) under a running worker: the next command makes new
    ones and sees none of the worker's changes, nor the worker its, so what it enqueues would wait for ever.
    The worker leaves as for a deleted file; a checkpoint or VACUUM, which keep both files, is no reason to."""
    ok(sqlite_db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    worker = workers.start()
    worker.wait_log("worker started")
    conn = sqlite3.connect(sqlite_db)
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    enqueue(sqlite_db, id="before", command="true", cwd=str(tmp_path))
    worker.wait_log("job before completed")
    enqueue(sqlite_db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    _wait_started(tmp_path)
    for name in (f"{sqlite_db}-wal", f"{sqlite_db}-shm"):
        os.unlink(name)
    worker.wait_log(f"{sqlite_db}-wal and {sqlite_db}-shm, which this worker opened")
    assert worker.popen.poll() is None  # its job still runs
    (tmp_path / "release").touch()
    assert worker.wait() == 1, worker.log()
    assert "job run completed" in worker.log()


def test_a_worker_leaves_a_database_whose_folder_was_replaced_by_a_file(tmp_path, monkeypatch):
    """`mv queue queue.old; touch queue` under a worker of queue/queue.db: its path leads to no file (ENOTDIR,
    not ENOENT). It leaves as for a deleted file, instead of failing its housekeeping after every heartbeat
    (no sweep, no cancel honoured) for ever."""
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    (tmp_path / "queue").mkdir()
    db = str(tmp_path / "queue" / "queue.db")
    ok(db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    pool = Workers(db, tmp_path)
    try:
        worker = pool.start()
        worker.wait_log("worker started")
        _wait_started(tmp_path)
        (tmp_path / "queue").rename(tmp_path / "queue.old")
        (tmp_path / "queue").touch()
        worker.wait_log(f"{db} is no longer the database file this worker opened")
        (tmp_path / "release").touch()
        assert worker.wait() == 1, worker.log()
        assert "housekeeping failed" not in worker.log() and "job run completed" in worker.log()
    finally:
        pool.cleanup()


def test_a_worker_presumed_dead_across_an_upgrade_leaves_instead_of_registering_again(db, workers, tmp_path):
    """Our lease ran out (a paused worker, a network cut) while a newer queuectl, finding us dead, upgraded the
    schema: at the next heartbeat our row is gone and registering again would be refused, at every beat for
    ever. The worker kills its requeued job, as after any lost registration, and leaves: exit 1."""
    ok(db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    shell = int((tmp_path / "sh.pid").read_text())
    newer = queuectl.SCHEMA_VERSION + 1
    with opened(db) as s:  # the sweep that dropped us and the migration, together: no beat between them
        s.write(lambda cur: (cur.execute("DELETE FROM workers"), cur.execute(
            "UPDATE queuectl_version SET version = %s" % newer if is_pg(db) else f"PRAGMA user_version = {newer}")))
    try:
        assert worker.wait() == 1, worker.log()
    finally:
        set_schema_version(db, queuectl.SCHEMA_VERSION)
    assert f"upgraded to schema {newer}" in worker.log() and "re-registering" not in worker.log()
    wait_for(lambda: pid_gone(shell), "the requeued job's shell to be killed", timeout=10)


def test_a_worker_leaving_without_its_registration_says_so_once(sqlite_db, monkeypatch, caplog):
    """Presumed dead by a database that moved on, the worker leaves once its killed runs are recorded: every
    beat meanwhile finds its row gone again. That is one event, logged once, not an error line a beat."""
    worker = queuectl.Worker(sqlite_db, 1, False)  # never registered: each beat finds no row
    try:
        monkeypatch.setattr(worker.store, "moved_on", lambda: "the database moved on (injected)")
        with caplog.at_level("ERROR", logger="queuectl"):
            for _ in range(3):
                worker._heartbeat()
        lines = [r.getMessage() for r in caplog.records if "presumed dead" in r.getMessage()]
        assert len(lines) == 1 and lines[0].endswith("leaving"), lines
        assert worker.leaving and worker.stopping.is_set()
    finally:
        worker.store.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_worker_leaves_a_database_file_that_was_deleted_or_replaced(sqlite_db, workers, tmp_path, how):
    """`rm queue.db*` (or a new file moved over it) under a running worker: the path names another file, where
    commands now enqueue. The worker sees it within a heartbeat, logs it naming the path, claims nothing
    more, lets its running job finish, and exits 1 (rather than serving a file nobody else sees)."""
    ok(sqlite_db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    enqueue(sqlite_db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start("--count", "2")
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    for name in (sqlite_db, f"{sqlite_db}-wal", f"{sqlite_db}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    if how == "replaced":
        other = str(tmp_path / "other.db")
        ok(other, "config", "set", "max-retries", "3")
        os.rename(other, sqlite_db)
    worker.wait_log(f"{sqlite_db} is no longer the database file this worker opened")
    enqueue(sqlite_db, id="new", command="true")  # in the file the path names now: this worker must not claim it
    assert worker.popen.poll() is None  # its job still runs
    (tmp_path / "release").touch()
    assert worker.wait() == 1, worker.log()
    assert "job run completed" in worker.log() and "job new claimed" not in worker.log()
    assert get_job(sqlite_db, "new")["state"] == "pending"


def test_a_version_1_database_upgrades_and_keeps_its_jobs(db, monkeypatch):
    with monkeypatch.context() as m:  # a queue made by the previous queuectl: schema version 1
        m.setattr(queuectl, "SCHEMA_VERSION", 1)
        m.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:1])
        m.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:1])
        with opened(db) as old:
            enqueue_older(old, "low", queue="deploy")
            enqueue_older(old, "high", queue="deploy", priority=5)
    with opened(db) as s:
        register(s)
        s.set_limit("deploy", 1)
        assert s.claim("w1", T0).id == "high" and s.claim("w1", T0) is None
        assert s.limits() == {"deploy": 1}


# ---- priority, run_at and queues -----------------------------------------------------------------

def test_a_job_scheduled_for_later_is_promoted_when_due_and_keeps_its_priority(store):
    register(store)
    store.enqueue([spec("low1"), spec("low2"), spec("high", priority=3, run_at=T0 + 10)], T0)
    assert store.claim("w1", T0).id == "low1"
    assert not store.due_now(T0, ("other",))  # a queue with nothing in it
    assert store.due_now(T0 + 10, ("other",))  # a staged job fell due (somewhere): wake to promote it
    assert store.claim("w1", T0 + 10).id == "high"  # promoted, ahead of the older low2
    assert store.claim("w1", T0 + 10).id == "low2"


def test_claim_order_is_priority_then_earliest_due_then_enqueue_order(store):
    register(store)
    store.enqueue([spec("low", priority=0, run_at=T0)], T0)
    store.enqueue([spec("neg", priority=-5, run_at=T0 - 100)], T0)
    store.enqueue([spec("high-late", priority=5, run_at=T0 + 5)], T0)
    store.enqueue([spec("high-b", priority=5, run_at=T0 + 1)], T0)
    store.enqueue([spec("high-a", priority=5, run_at=T0 + 1)], T0 + 1)  # same due, enqueued later
    store.enqueue([spec("high-first", priority=5, run_at=T0 + 0.5)], T0 + 2)
    store.enqueue([spec("top-not-due", priority=9, run_at=T0 + 100)], T0)
    assert claim_ids(store, T0 + 2) == ["high-first", "high-b", "high-a", "low", "neg"]
    assert claim_ids(store, T0 + 10) == ["high-late"]  # a high priority never makes a job due early
    assert claim_ids(store, T0 + 100) == ["top-not-due"]


def test_claim_with_queues_takes_only_those(store):
    register(store)
    for job_id, queue in (("d", "default"), ("a1", "alpha"), ("b1", "beta"), ("a2", "alpha")):
        store.enqueue([spec(job_id, queue=queue)], T0)
    assert claim_ids(store, T0, ("alpha",)) == ["a1", "a2"]
    assert claim_ids(store, T0, ("nothing-here",)) == []
    assert claim_ids(store, T0, ("beta", "default")) == ["d", "b1"]


def test_enqueue_stores_the_scheduling_fields(db):
    job = enqueue(db, id="s1", command="true", priority=5, queue="batch.nightly-1_x",
                  run_at="2030-01-01T12:00:00Z")
    assert (job["priority"], job["queue"], job["next_run_at"]) == (5, "batch.nightly-1_x", "2030-01-01T12:00:00.000Z")
    shown = get_job(db, "s1")
    assert (shown["priority"], shown["queue"], shown["next_run_at"]) == \
        (5, "batch.nightly-1_x", "2030-01-01T12:00:00.000Z")
    plain = enqueue(db, id="s2", command="true")
    assert (plain["priority"], plain["queue"]) == (0, "default")


@pytest.mark.parametrize("run_at, expected", [
    ("2030-01-01T12:00:00Z", "2030-01-01T12:00:00.000Z"),
    ("2030-01-01T12:00:00+02:00", "2030-01-01T10:00:00.000Z"),
    ("2030-01-01T12:00:00.250-01:30", "2030-01-01T13:30:00.250Z"),
    (1893499200, "2030-01-01T12:00:00.000Z"),
    (1893499200.5, "2030-01-01T12:00:00.500Z"),
], ids=["iso-Z", "iso-plus-offset", "iso-minus-offset-fraction", "epoch-int", "epoch-float"])
def test_enqueue_run_at_forms(db, run_at, expected):
    assert enqueue(db, command="true", run_at=run_at)["next_run_at"] == expected


def test_enqueue_run_at_without_offset_is_local_time(db, local_tz):
    local_tz("EST5")
    assert enqueue(db, command="true", run_at="2030-01-01T12:00:00")["next_run_at"] == "2030-01-01T17:00:00.000Z"
    local_tz("JST-9")
    assert enqueue(db, command="true", run_at="2030-01-01T12:00:00")["next_run_at"] == "2030-01-01T03:00:00.000Z"


def test_enqueue_delay_makes_the_job_due_later(db):
    before = time.time()
    job = enqueue(db, command="true", delay=3600)
    after = time.time()
    due = parse_iso(job["next_run_at"]).timestamp()
    assert before + 3600 - 0.001 <= due <= after + 3600 + 0.001
    assert parse_iso(enqueue(db, command="true", delay=0)["next_run_at"]).timestamp() <= time.time()


@sqlite_only
@pytest.mark.parametrize("fields, fragment", [case[1:] for case in BAD_SCHEDULING],
                         ids=[case[0] for case in BAD_SCHEDULING])
def test_enqueue_rejects_bad_scheduling_fields(seeded_db, fields, fragment):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", json.dumps({"command": "true", **fields}))
    assert (code, out) == (2, ""), err
    assert_one_error(err, fragment)
    assert snapshot(seeded_db) == before


def test_list_and_status_by_queue(db):
    for job_id, queue in (("a1", "alpha"), ("d1", "default"), ("a2", "alpha"), ("b1", "beta")):
        enqueue(db, id=job_id, command="true", queue=queue)
    assert list_ids(db, "--queue", "alpha") == ["a1", "a2"]
    assert list_ids(db, "--queue", "default") == ["d1"]
    assert list_ids(db, "--queue", "nobody") == []
    assert list_ids(db, "--queue", "alpha", "--state", "pending", "--limit", "1") == ["a2"]
    text = ok(db, "list", "--queue", "beta")
    assert "b1" in text and "a1" not in text and "beta" in text
    counts = json.loads(ok(db, "status", "--queue", "alpha", "--json"))["jobs"]
    assert counts == {"pending": 2, "processing": 0, "completed": 0, "failed": 0, "dead": 0}
    assert json.loads(ok(db, "status", "--json"))["jobs"]["pending"] == 4
    assert re.search(r"pending\s+2\b", ok(db, "status", "--queue", "alpha"))


@sqlite_only
@pytest.mark.parametrize("args", [("list", "--queue", "a b"), ("list", "--queue", ""),
                                  ("status", "--queue", "q" * 65), ("status", "--queue", "a/b"),
                                  ("worker", "start", "--queue", "bad name", "--burst"),
                                  ("pause", "--queue", "é"), ("resume", "--queue", "a b")],
                         ids=["list-space", "list-empty", "status-65", "status-slash", "worker-start",
                              "pause", "resume"])
def test_bad_queue_names_on_the_command_line_exit_2(seeded_db, args):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, *args)
    assert_argparse_error(code, err)
    assert out == ""
    assert snapshot(seeded_db) == before


def test_one_worker_thread_runs_due_jobs_by_priority(db, workers, tmp_path):
    for job_id, priority in (("low", 0), ("high", 10), ("neg", -1), ("mid", 5)):
        enqueue(db, id=job_id, command=f"echo {job_id} >> order", priority=priority, cwd=str(tmp_path))
    worker = workers.start("--burst", "--count", "1")
    assert worker.wait() == 0, worker.log()
    assert (tmp_path / "order").read_text().split() == ["high", "mid", "low", "neg"]


def test_a_delayed_job_does_not_start_before_it_is_due(db, workers, tmp_path):
    job = enqueue(db, id="later", command="date +%s.%N > ran", delay=1.5, cwd=str(tmp_path))
    worker = workers.start("--burst")  # burst waits for jobs due within its horizon
    assert worker.wait() == 0, worker.log()
    assert state_of(db, "later") == "completed"
    assert float((tmp_path / "ran").read_text()) >= parse_iso(job["next_run_at"]).timestamp()


def test_worker_with_queues_claims_and_drains_only_those(db, workers, tmp_path):
    for job_id, queue in (("a", "alpha"), ("b", "beta"), ("d", "default")):
        enqueue(db, id=job_id, command="true", queue=queue, cwd=str(tmp_path))
    worker = workers.start("--burst", "--queue", "alpha", "--queue", "beta")
    assert worker.wait() == 0, worker.log()
    assert {i: state_of(db, i) for i in "abd"} == {"a": "completed", "b": "completed", "d": "pending"}
    assert list_ids(db, "--queue", "default", "--state", "pending") == ["d"]


# ---- pause and resume ----------------------------------------------------------------------------

def test_claim_skips_paused_queues_until_resumed(store):
    register(store)
    store.enqueue([spec("a", queue="alpha")], T0)
    store.enqueue([spec("b", queue="beta")], T0)
    store.pause(["alpha"])
    assert store.paused() == ["alpha"]
    assert store.claim("w1", T0, ("alpha",)) is None
    assert claim_ids(store, T0) == ["b"]
    assert not store.due_now(T0)  # a paused job is not due: --burst does not wait for it
    store.resume(["alpha"])
    assert store.paused() == []
    assert claim_ids(store, T0) == ["a"]


def test_pause_of_everything_stops_every_claim(store):
    register(store)
    store.enqueue([spec("a", queue="alpha")], T0)
    store.enqueue([spec("d")], T0)
    store.pause(["*"])
    assert store.claim("w1", T0) is None
    assert store.claim("w1", T0, ("alpha",)) is None
    store.resume([])
    assert store.paused() == []
    assert claim_ids(store, T0) == ["a", "d"]


def test_pause_and_resume_show_in_status(db):
    assert ok(db, "pause", "--queue", "alpha", "--queue", "beta") == "paused alpha, beta\n"
    assert json.loads(ok(db, "status", "--json"))["paused"] == ["alpha", "beta"]
    assert "alpha" in ok(db, "status") and "beta" in ok(db, "status")
    assert ok(db, "resume", "--queue", "alpha") == "resumed alpha\n"
    assert json.loads(ok(db, "status", "--json"))["paused"] == ["beta"]
    ok(db, "pause")  # everything
    paused = json.loads(ok(db, "status", "--json"))["paused"]
    assert paused and set(paused) != {"beta"}
    assert "all" in ok(db, "status")
    assert ok(db, "resume") == "resumed all queues\n"
    assert json.loads(ok(db, "status", "--json"))["paused"] == []
    assert "paused" not in ok(db, "status")


def test_pause_twice_and_resume_of_a_running_queue_are_harmless(db):
    ok(db, "pause", "--queue", "alpha")
    ok(db, "pause", "--queue", "alpha")
    ok(db, "resume", "--queue", "never-paused")
    assert json.loads(ok(db, "status", "--json"))["paused"] == ["alpha"]


def test_resume_of_one_queue_while_every_queue_is_paused_claims_from_it_alone(store):
    register(store)
    store.enqueue([spec("i", queue="images"), spec("v", queue="video"), spec("d")], T0)
    store.pause(["*"])
    store.resume(["images"])
    store.pause(["video"])  # already paused by '*': no row of its own
    assert store.paused() == ["!images", "*"]
    assert set(store.oldest_eligible_by_queue(T0)) == {"images"}
    assert store.due_now(T0) and store.due_now(T0, ("images",)) and not store.due_now(T0, ("video",))
    assert store.claim("w1", T0, ("video", "default")) is None
    assert claim_ids(store, T0) == ["i"]
    assert not store.due_now(T0) and store.burst_done(T0 + 1, ("video",))
    store.resume(["video"])
    store.pause(["images"])  # paused again: its '!images' goes
    assert store.paused() == ["!video", "*"]
    assert claim_ids(store, T0) == ["v"]
    store.pause(["*"])  # every queue again, whatever was resumed alone
    assert (store.paused(), claim_ids(store, T0)) == (["*"], [])
    store.resume([])
    assert (store.paused(), claim_ids(store, T0)) == ([], ["d"])


def test_resume_of_one_queue_while_every_queue_is_paused_holds_without_returning(sqlite_store, monkeypatch):
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)
    register(sqlite_store)
    sqlite_store.enqueue([spec("i", queue="images"), spec("v", queue="video")], T0)
    sqlite_store.pause(["*"])
    sqlite_store.resume(["images"])
    assert claim_ids(sqlite_store, T0, ("video", "images")) == ["i"]
    assert claim_ids(sqlite_store, T0) == []


def test_resume_of_one_queue_after_pause_all_shows_and_runs_it_alone(db, workers, tmp_path):
    enqueue(db, id="i", command="true", queue="images", cwd=str(tmp_path))
    enqueue(db, id="v", command="true", queue="video", cwd=str(tmp_path))
    assert ok(db, "pause") == "paused all queues\n"
    assert ok(db, "resume", "--queue", "images") == "resumed images\n"
    status = json.loads(ok(db, "status", "--json"))
    assert (status["paused"], status["paused_except"]) == (["*"], ["images"])
    assert "paused: all queues except images\n" in ok(db, "status")
    assert {q["queue"]: q["paused"] for q in json.loads(ok(db, "queues", "--json"))} == {
        "images": False, "video": True}
    assert [line.split()[4] for line in ok(db, "list").splitlines()[1:]] == ["now", "paused"]
    worker = workers.start("--burst")  # the paused queue's job is not due: the burst does not wait for it
    assert worker.wait() == 0, worker.log()
    assert (state_of(db, "i"), state_of(db, "v")) == ("completed", "pending")
    assert ok(db, "resume") == "resumed all queues\n"
    status = json.loads(ok(db, "status", "--json"))
    assert (status["paused"], status["paused_except"]) == ([], [])


def test_pause_of_a_queue_nothing_names_says_so_with_the_closest_name(db):
    enqueue(db, id="i", command="true", queue="images")
    ok(db, "limit", "nightly", "2")
    code, out, err = cli(db, "pause", "--queue", "imgaes")
    assert (code, out) == (0, "paused imgaes\n")
    assert err == "queuectl: note: queue 'imgaes' has no jobs, workers or limit yet (did you mean 'images'?)\n"
    assert json.loads(ok(db, "status", "--json"))["paused"] == ["imgaes"]  # paused all the same
    assert cli(db, "pause", "--queue", "zzz")[2].endswith("has no jobs, workers or limit yet (is the name right?)\n")
    for known in ("images", "nightly", "imgaes"):  # a job, a limit, a pause name it
        assert cli(db, "pause", "--queue", known)[2] == ""
    assert cli(db, "pause")[2] == ""


def test_a_paused_queue_is_not_claimed_until_resumed(db, workers, tmp_path):
    enqueue(db, id="a", command="true", queue="alpha", cwd=str(tmp_path))
    enqueue(db, id="b", command="true", queue="beta", cwd=str(tmp_path))
    ok(db, "pause", "--queue", "alpha")
    worker = workers.start("--burst")  # a paused job is not due: the burst does not wait for it
    assert worker.wait() == 0, worker.log()
    assert (state_of(db, "a"), state_of(db, "b")) == ("pending", "completed")
    ok(db, "resume", "--queue", "alpha")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    assert state_of(db, "a") == "completed"


def test_pause_lets_the_running_job_finish_and_claims_nothing_new(db, workers, tmp_path):
    enqueue(db, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    ok_when_free(db, "pause")
    enqueue(db, id="next", command="true", cwd=str(tmp_path))
    (tmp_path / "release").touch()
    wait_for(lambda: state_of(db, "long") == "completed", "the running job to finish while paused")
    deadline = time.monotonic() + 1.0  # the worker polls every 50 ms: a second is many chances
    while time.monotonic() < deadline:
        assert state_of(db, "next") == "pending"
        time.sleep(0.1)
    ok_when_free(db, "resume")
    wait_for(lambda: state_of(db, "next") == "completed", "the job to run once resumed")


def test_postgres_a_pause_waits_for_a_claim_in_flight_so_no_job_of_its_queue_starts_after_it(pg_url):
    # A claim that began before `pause` committed saw no pause: had `pause` returned before that claim
    # committed, a job of the paused queue would start after `pause` printed "paused".
    first, second = queuectl.PostgresStore(pg_url), queuectl.PostgresStore(pg_url)
    try:
        register(first, "w1")
        first.enqueue([spec("a", queue="images")], T0)
        after = {}

        def pause():
            second.pause(["images"])
            after["processing"] = second.counts("images")["processing"]
        with first.conn.transaction():
            assert first._claim_in(first.conn.cursor(), "w1", T0, ()).id == "a"
            thread = threading.Thread(target=pause)
            thread.start()
            wait_for(lambda: after or _waiting_for_a_lock(first), "the pause to return or to wait")
        thread.join(WAIT_S)
        assert after == {"processing": 1}  # when `pause` returned, the claim had committed
        assert second.claim("w1", T0) is None
    finally:
        for store in (first, second):
            store.close()


def test_resume_of_a_queue_nothing_names_says_so_with_the_closest_name(db):
    enqueue(db, id="i", command="true", queue="images")
    ok(db, "pause")
    code, out, err = cli(db, "resume", "--queue", "imgaes")
    assert (code, out) == (0, "resumed imgaes\n")  # a typo would leave 'images' paused, with no word
    assert err == "queuectl: note: queue 'imgaes' has no jobs, workers or limit yet (did you mean 'images'?)\n"
    assert cli(db, "resume", "--queue", "images")[2] == ""
    assert json.loads(ok(db, "status", "--json"))["paused_except"] == ["images", "imgaes"]
    assert cli(db, "resume")[2] == ""


def test_enqueue_and_add_into_a_paused_queue_say_so_on_stderr(db):
    ok(db, "pause", "--queue", "night")
    code, out, err = cli(db, "enqueue", '{"id": "n", "command": "true", "queue": "night"}')
    assert (code, out) == (0, "n\n")
    assert err == "queuectl: note: queue 'night' is paused; jobs wait for `queuectl resume --queue night`\n"
    assert cli(db, "add", "--", "true")[2] == ""  # another queue: nothing to say
    batch = '{"command": "true", "queue": "night"}\n{"command": "true", "queue": "day"}\n'
    assert cli(db, "enqueue", "-", stdin=batch)[2].count("note: queue 'night' is paused") == 1
    ok(db, "pause")
    code, out, err = cli(db, "add", "--json", "--", "true")
    assert code == 0 and json.loads(out)["state"] == "pending"
    assert err == ("queuectl: note: all queues are paused; jobs wait for `queuectl resume --queue default` "
                   "(or `queuectl resume`, for all)\n")
    ok(db, "resume", "--queue", "night")
    assert "queuectl: note: all queues except night are paused" in cli(db, "add", "--", "true")[2]
    assert cli(db, "add", "--queue", "night", "--", "true")[2] == ""


# ---- dependencies --------------------------------------------------------------------------------

@pytest.fixture
def chain_db(db):
    """a (dead: exit 1, no retry) <- b <- c, all dead; built through a Store at the real time."""
    now = time.time()
    with opened(db) as s:
        register(s, now=now)
        s.enqueue([spec("a", "exit 1", max_retries=0), spec("b", depends_on=["a"]),
                   spec("c", depends_on=["b"])], now)
        finish_next(s, 1, now)
        s.deregister("w1")
    return db


def test_dependent_is_not_claimable_until_its_dependency_completed(store):
    register(store)
    store.enqueue([spec("a"), spec("b", priority=9, depends_on=["a"])], T0)
    assert store.get("b").waiting_on == 1
    first = store.claim("w1", T0)
    assert first.id == "a"  # b's priority does not matter while it waits
    assert store.claim("w1", T0 + 1) is None
    store.finish(first, "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 1)  # failed, will retry
    assert store.get("b").waiting_on == 1
    assert store.claim("w1", T0 + 2) is None  # a backs off until T0 + 3; b still waits
    assert store.claim("w1", T0 + 3).id == "a"
    store.finish(store.get("a"), "w1", outcome(), SETTINGS, T0 + 4)
    assert store.get("b").waiting_on == 0
    assert claim_ids(store, T0 + 4) == ["b"]


def test_dependent_waits_for_every_dependency(store):
    register(store)
    store.enqueue([spec("a"), spec("b"), spec("c", depends_on=["a", "b"])], T0)
    assert store.depends_on("c") == ["a", "b"]
    finish_next(store, 0, T0)
    assert store.claim("w1", T0 + 1).id == "b"  # c still waits for b
    store.finish(store.get("b"), "w1", outcome(), SETTINGS, T0 + 1)
    assert claim_ids(store, T0 + 1) == ["c"]


def test_enqueue_on_a_completed_dependency_is_due_at_once(store):
    register(store)
    store.enqueue([spec("a")], T0)
    finish_next(store, 0, T0)
    store.enqueue([spec("b", depends_on=["a"])], T0 + 1)
    assert store.get("b").waiting_on == 0
    assert claim_ids(store, T0 + 1) == ["b"]


def test_unknown_dependency_is_not_found_and_nothing_is_stored(store):
    store.enqueue([spec("a")], T0)
    with pytest.raises(queuectl.NotFound, match="nope"):
        store.enqueue([spec("x"), spec("y", depends_on=["a", "nope"])], T0)
    assert [j.id for j in store.list_jobs()] == ["a"]


def test_a_dead_dependency_takes_the_chain_to_dead(store):
    register(store)
    store.enqueue([spec("a", max_retries=0), spec("b", depends_on=["a"]), spec("c", depends_on=["b"]),
                   spec("free")], T0)
    assert finish_next(store, 1, T0).state == "dead"
    b, c = store.get("b"), store.get("c")
    assert (b.state, c.state) == ("dead", "dead")
    assert "a" in b.last_error and "dead" in b.last_error
    assert "b" in c.last_error
    assert (b.run_count, c.run_count) == (0, 0)
    assert store.get("free").state == "pending"


def test_enqueue_on_a_dead_dependency_is_refused_and_stores_nothing(store):
    register(store)
    store.enqueue([spec("a", max_retries=0), spec("ok")], T0)
    finish_next(store, 1, T0)
    with pytest.raises(queuectl.Conflict, match="'b' depends on 'a', which is dead"):
        store.enqueue([spec("x"), spec("b", depends_on=["ok", "a"]), spec("y")], T0 + 1)
    assert [j.id for j in store.list_jobs()] == ["a", "ok"]


def test_retry_of_a_dependent_alone_is_refused_while_its_dependency_is_dead(store):
    register(store)
    store.enqueue([spec("a", max_retries=0), spec("b", depends_on=["a"]), spec("c", depends_on=["b"])], T0)
    finish_next(store, 1, T0)
    for alone in (["b"], ["c"], ["b", "c"]):
        with pytest.raises(queuectl.Conflict, match="'a'" if "b" in alone else "'b'"):
            store.retry_dead(alone, T0 + 1)
        assert [store.get(i).state for i in "abc"] == ["dead"] * 3
    store.retry_dead(["c", "b", "a"], T0 + 2)  # dependents first: still counted as waiting
    assert [(store.get(i).state, store.get(i).waiting_on) for i in "abc"] == \
        [("pending", 0), ("pending", 1), ("pending", 1)]
    order = []
    for step in range(3):
        order.append(finish_next(store, 0, T0 + 3 + step).id)
    assert order == ["a", "b", "c"]


def test_a_job_waiting_for_a_dependency_is_not_due(store):
    register(store)
    store.enqueue([spec("a", run_at=T0 + 7200), spec("b", depends_on=["a"])], T0)
    assert not store.due_now(T0 + 7199)  # b is not due at all, only a, in two hours
    assert store.due_now(T0 + 7200)
    assert store.burst_done(T0)
    store.enqueue([spec("x", queue="other"), spec("y", queue="mine", depends_on=["x"])], T0)
    assert store.burst_done(T0, ("mine",))  # y waits for a job of another queue


def test_postgres_a_job_enqueued_on_a_chain_whose_head_dies_meanwhile_goes_dead_too(pg_url):
    """PostgreSQL runs writes side by side: C is enqueued on B (B -> A) while A dies. The cascade's
    first statement did not see C, which committed while it waited for B's lock; C must not wait
    forever on a dead chain."""
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s, \
            contextlib.closing(queuectl.PostgresStore(pg_url)) as other:
        register(s)
        s.enqueue([spec("a", max_retries=1)], T0)
        s.enqueue([{**spec("b"), "depends_on": ["a"]}], T0)
        job = s.claim("w1", T0)
        inserted, finished = threading.Event(), threading.Event()

        def enqueue_c(cur):  # holds B's row lock (taken by the enqueue) until A's death waits on it
            other._insert_with_deps(cur, {**spec("c"), "depends_on": ["b"]}, T0)
            inserted.set()
            finished.wait(0.5)  # A's cascade waits on B meanwhile, for less than lock_timeout (1 s)
        t = threading.Thread(target=lambda: other.write(enqueue_c))
        t.start()
        inserted.wait(30)
        s.finish(job, "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 1)
        finished.set()
        t.join()
        assert [(s.get(i).state, s.get(i).last_error) for i in "abc"] == [
            ("dead", "exit code 1"), ("dead", "dependency a is dead"), ("dead", "dependency b is dead")]


def test_deleting_a_dependency_forgets_its_edges(store):
    register(store)
    store.enqueue([spec("build")], T0)
    store.enqueue([{**spec("deploy"), "depends_on": ["build"], "run_at": T0 + 3600}], T0)
    store.finish(store.claim("w1", T0), "w1", outcome(), SETTINGS, T0)
    assert store.purge("completed", T0 + 1) == 1
    store.enqueue([spec("build", command="exit 1", max_retries=1)], T0 + 2)  # the id is reused
    store.finish(store.claim("w1", T0 + 2), "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 2)
    assert store.get("deploy").state == "pending"  # the new 'build' is not its dependency


def test_enqueue_with_dependencies(db):
    enqueue(db, id="a", command="true")
    enqueue(db, id="b", command="true")
    job = enqueue(db, id="c", command="true", depends_on=["a", "b"])
    assert job["waiting_on"] == 2
    assert get_job(db, "c")["depends_on"] == ["a", "b"]
    assert "a" in ok(db, "show", "c")


def test_enqueue_with_an_unknown_dependency_exits_1_and_stores_nothing(seeded_db):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", _j(id="x", command="true", depends_on=["keep", "nope"]))
    assert (code, out) == (1, "")
    assert_one_error(err, "nope")
    assert snapshot(seeded_db) == before


def test_enqueue_depending_on_itself_exits_nonzero_and_stores_nothing(seeded_db):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", _j(id="me", command="true", depends_on=["me"]))
    assert code in (1, 2) and out == ""
    assert_one_error(err, "me")
    assert snapshot(seeded_db) == before


def test_a_dead_dependency_shows_on_its_dependents(chain_db):
    b, c = get_job(chain_db, "b"), get_job(chain_db, "c")
    assert (b["state"], c["state"]) == ("dead", "dead")
    assert "a" in b["last_error"] and "b" in c["last_error"]
    assert list_ids(chain_db, "--state", "dead") == ["a", "b", "c"]


@pytest.mark.parametrize("ids, named", [(["b"], "a"), (["c"], "b"), (["c", "b"], "a")])
def test_dlq_retry_of_a_dependent_without_its_dead_dependency_exits_1(chain_db, ids, named):
    before = snapshot(chain_db)
    code, out, err = cli(chain_db, "dlq", "retry", *ids)
    assert (code, out) == (1, "")
    assert_one_error(err, named)
    assert snapshot(chain_db) == before


def test_dlq_retry_of_a_whole_chain_revives_it_waiting_in_order(chain_db):
    assert ok(chain_db, "dlq", "retry", "c", "b", "a") == "c\nb\na\n"
    jobs = {job["id"]: job for job in json.loads(ok(chain_db, "list", "--json"))}
    assert {i: (j["state"], j["waiting_on"], j["last_error"]) for i, j in jobs.items()} == \
        {"a": ("pending", 0, None), "b": ("pending", 1, None), "c": ("pending", 1, None)}


def test_enqueue_on_a_dead_dependency_exits_1_naming_it_and_stores_nothing(chain_db):
    before = snapshot(chain_db)
    code, out, err = cli(chain_db, "enqueue", json.dumps({"id": "d", "command": "true", "depends_on": ["a"]}))
    assert (code, out) == (1, "")
    assert_one_error(err, "'d'", "'a'", "dead")
    for data, where, dead in (
            (jsonl({"id": "x", "command": "true"}, {"id": "d", "command": "true", "depends_on": ["b"]}),
             "line 2", "'b'"),
            (json.dumps([{"id": "x", "command": "true"}, {"id": "d", "command": "true", "depends_on": ["x", "c"]}]),
             "item 2", "'c'")):
        code, out, err = cli(chain_db, "enqueue", "-", stdin=data)
        assert (code, out) == (1, ""), err
        assert_one_error(err, where, dead, "dead")
    assert snapshot(chain_db) == before


def test_a_dependency_chain_dies_together_and_is_revived_in_order(db, workers, tmp_path):
    enqueue(db, id="a", command="echo a >> order; [ -e fixed ]", max_retries=0, cwd=str(tmp_path))
    enqueue(db, id="b", command="echo b >> order", depends_on=["a"], priority=10, cwd=str(tmp_path))
    enqueue(db, id="c", command="echo c >> order", depends_on=["b"], priority=20, cwd=str(tmp_path))
    worker = workers.start("--burst", "--count", "2")
    assert worker.wait() == 0, worker.log()
    jobs = {i: get_job(db, i) for i in "abc"}
    assert [jobs[i]["state"] for i in "abc"] == ["dead"] * 3
    assert "a" in jobs["b"]["last_error"] and "b" in jobs["c"]["last_error"]
    assert (jobs["b"]["run_count"], jobs["c"]["run_count"]) == (0, 0)
    assert (tmp_path / "order").read_text() == "a\n"

    before = snapshot(db)
    result = script(db, "dlq", "retry", "c")
    assert (result.returncode, result.stdout) == (1, "")
    assert_one_error(result.stderr, "b")
    assert snapshot(db) == before

    (tmp_path / "fixed").touch()
    assert ok(db, "dlq", "retry", "c", "b", "a") == "c\nb\na\n"
    worker = workers.start("--burst", "--count", "2")
    assert worker.wait() == 0, worker.log()
    assert [state_of(db, i) for i in "abc"] == ["completed"] * 3
    assert (tmp_path / "order").read_text() == "a\na\nb\nc\n"


def test_burst_does_not_wait_for_jobs_whose_dependency_is_not_due(db, workers, tmp_path):
    enqueue(db, id="later", command="true", delay=3600, cwd=str(tmp_path))
    enqueue(db, id="waiter", command="true", depends_on=["later"], cwd=str(tmp_path))
    enqueue(db, id="x", command="true", queue="other", cwd=str(tmp_path))
    enqueue(db, id="y", command="true", queue="mine", depends_on=["x"], cwd=str(tmp_path))
    worker = workers.start("--burst", "--queue", "mine")  # y waits on x, which it does not drain
    assert worker.wait() == 0, worker.log()
    assert (state_of(db, "x"), state_of(db, "y")) == ("pending", "pending")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    assert {i: state_of(db, i) for i in ("later", "waiter", "x", "y")} == \
        {"later": "pending", "waiter": "pending", "x": "completed", "y": "completed"}


# ---- run history ---------------------------------------------------------------------------------

@pytest.fixture
def history_db(db):
    """h1 ran three times at the real time: failed ('one'), dead ('two'), then after dlq retry completed ('three')."""
    now = time.time() - 30
    with opened(db) as s:
        register(s, now=now)
        s.enqueue([spec("h1", "echo", max_retries=2)], now)
        finish_next(s, 1, now, "one\n", ended=now + 1)
        finish_next(s, 1, now + 3, "two\n", ended=now + 4)
        s.retry_dead(["h1"], now + 5)
        finish_next(s, 0, now + 5, "three\n", ended=now + 7.5)
        s.deregister("w1")
    return db


def test_runs_are_numbered_in_order_and_continue_after_retry(store):
    register(store)
    store.enqueue([spec(max_retries=2)], T0)
    assert finish_next(store, 1, T0, "one", ended=T0 + 1).state == "failed"  # retry at T0 + 3
    assert finish_next(store, 1, T0 + 3, "two", ended=T0 + 5).state == "dead"
    store.retry_dead(["j1"], T0 + 10)
    assert finish_next(store, 0, T0 + 10, "three", ended=T0 + 11.5).state == "completed"
    runs = store.runs("j1")
    assert [r["run"] for r in runs] == [1, 2, 3]
    assert [r["outcome"] for r in runs] == ["failed", "dead", "completed"]
    assert [r["output"] for r in runs] == [b"one", b"two", b"three"]
    assert [r["exit_code"] for r in runs] == [1, 1, 0]
    assert [(r["started_at"], r["ended_at"]) for r in runs] == [(T0, T0 + 1), (T0 + 3, T0 + 5), (T0 + 10, T0 + 11.5)]
    assert {r["worker_id"] for r in runs} == {"w1"}
    assert store.get("j1").run_count == 3
    assert store.run_output("j1")[:2] == (3, b"three")
    assert store.run_output("j1", 1)[:2] == (1, b"one")
    assert store.run_output("j1", 4) is None


def test_a_run_cut_short_by_a_lost_worker_is_recorded(store):
    register(store)
    store.enqueue([spec()], T0)
    job = store.claim("w1", T0)
    store.flush_output(job, b"partial\n", 8)
    assert store.interrupt(job, "w1", LOST, True, T0 + 4) == "pending"
    finish_next(store, 0, T0 + 5, "again\n")
    runs = store.runs("j1")
    assert [(r["run"], r["outcome"]) for r in runs] == [(1, "lost"), (2, "completed")]
    assert runs[0]["ended_at"] == T0 + 4 and runs[0]["output"] == b"partial\n"  # what was flushed stays
    assert "lost" in runs[0]["error"]


def test_show_json_has_the_runs_oldest_first(history_db):
    job = get_job(history_db, "h1")
    runs = job["runs"]
    assert all(RUN_KEYS <= run.keys() for run in runs), runs[0].keys()
    assert [r["run"] for r in runs] == [1, 2, 3]
    assert [r["outcome"] for r in runs] == ["failed", "dead", "completed"]
    assert [r["exit_code"] for r in runs] == [1, 1, 0]
    assert [r["output"] for r in runs] == ["one\n", "two\n", "three\n"]
    assert [r["duration_s"] for r in runs] == pytest.approx([1, 1, 2.5])
    starts = [parse_iso(r["started_at"]) for r in runs]
    assert starts == sorted(starts)
    assert all(parse_iso(r["ended_at"]) >= parse_iso(r["started_at"]) for r in runs)
    assert (job["state"], job["run_count"], job["output"]) == ("completed", 3, "three\n")


def test_show_text_lists_the_runs(history_db):
    text = ok(history_db, "show", "h1")
    for fragment in ("#1", "#2", "#3", "failed", "dead", "completed", "three"):
        assert fragment in text, fragment


def test_logs_of_the_latest_run_or_of_run_n(history_db):
    assert ok(history_db, "logs", "h1") == "three\n"
    assert ok(history_db, "logs", "h1", "--run", "1") == "one\n"
    assert ok(history_db, "logs", "h1", "--run", "2") == "two\n"
    assert ok(history_db, "logs", "h1", "--run", "3") == "three\n"


@pytest.mark.parametrize("job_id, run", [("h1", "4"), ("h1", "99"), ("missing", "1"), ("never", "1")])
def test_logs_of_an_unknown_run_exits_1(history_db, job_id, run):
    enqueue(history_db, id="never", command="true")
    code, out, err = cli(history_db, "logs", job_id, "--run", run)
    assert (code, out) == (1, "")
    assert_one_error(err, job_id)


@sqlite_only
@pytest.mark.parametrize("run", ["0", "-1", "x"])
def test_logs_with_a_bad_run_number_exits_2(history_db, run):
    code, out, err = cli(history_db, "logs", "h1", "--run", run)
    assert code == 2 and out == "", err
    assert "Traceback" not in err


def test_logs_follow_of_a_finished_job_prints_its_output_and_returns(history_db):
    assert cli(history_db, "logs", "h1", "--follow") == (0, "three\n", "")
    assert ok(history_db, "logs", "h1", "--follow", "--run", "1") == "one\n"


def test_real_runs_are_recorded_and_numbered_across_dlq_retry(db, workers, tmp_path):
    ok(db, "config", "set", "backoff-base", "1")
    enqueue(db, id="h", command='echo "try $QUEUECTL_ATTEMPT"; [ -e fixed ]', max_retries=2, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    assert state_of(db, "h") == "dead"
    (tmp_path / "fixed").touch()
    ok(db, "dlq", "retry", "h")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()

    job = get_job(db, "h")
    runs = job["runs"]
    assert (job["state"], job["run_count"]) == ("completed", 3)
    assert [r["run"] for r in runs] == [1, 2, 3]
    assert [r["outcome"] for r in runs] == ["failed", "dead", "completed"]
    assert [r["exit_code"] for r in runs] == [1, 1, 0]
    assert [r["output"] for r in runs] == ["try 1\n", "try 2\n", "try 1\n"]
    assert all(r["duration_s"] is not None and r["duration_s"] >= 0 for r in runs)
    assert runs[0]["worker_id"] == runs[1]["worker_id"] != runs[2]["worker_id"]
    assert parse_iso(runs[1]["started_at"]).timestamp() - parse_iso(runs[0]["started_at"]).timestamp() >= 0.9
    assert ok(db, "logs", "h", "--run", "2") == "try 2\n"
    assert ok(db, "logs", "h") == "try 1\n"

    stats = json.loads(ok(db, "stats", "--json"))
    assert stats["runs"] == {"completed": 1, "failed": 1, "dead": 1}
    assert stats["duration_s"]["p50"] is not None and stats["duration_s"]["max"] is not None
    assert stats["wait_s"]["p50"] is not None and stats["throughput_per_min"] > 0
    assert stats["oldest_eligible_age_s"] is None


def test_a_run_cut_short_by_a_killed_worker_is_recorded_as_lost(db, workers, tmp_path):
    command = 'if [ -e first ]; then echo second run; else touch first; echo first run; sleep 60; fi'
    enqueue(db, id="k1", command=command, cwd=str(tmp_path))
    victim = workers.start()
    wait_for(lambda: (tmp_path / "first").exists(), "the first run to start")
    wait_for(lambda: ok_when_free(db, "logs", "k1") == "first run\n", "the running job's output in the db")
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    rescuer = workers.start("--burst")
    assert rescuer.wait(timeout=90) == 0, rescuer.log()
    runs = get_job(db, "k1")["runs"]
    assert [(r["run"], r["outcome"]) for r in runs] == [(1, "lost"), (2, "completed")]
    assert runs[0]["ended_at"] is not None and runs[0]["exit_code"] is None
    assert ok(db, "logs", "k1", "--run", "1") == "first run\n"
    assert ok(db, "logs", "k1") == "second run\n"


def test_logs_follow_streams_a_running_jobs_output_until_it_ends(db, workers, tmp_path):
    command = ('for i in 1 2 3 4 5 6 7; do echo "line $i"; sleep 0.3; done; '
               'i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo end')
    enqueue(db, id="f1", command=command, cwd=str(tmp_path))
    follow = workers.spawn("logs", "f1", "--follow")  # before any worker: it waits for the first run
    reader = LineReader(follow.stdout)
    workers.start()
    lines = [f"line {i}\n" for i in range(1, 8)]
    wait_for(lambda: reader.lines == lines or len(reader.lines) > len(lines), "seven lines streamed")
    assert reader.lines == lines
    assert follow.poll() is None  # the job cannot end before `release` exists
    assert state_of(db, "f1") == "processing"
    (tmp_path / "release").touch()
    assert follow.wait(timeout=WAIT_S) == 0
    reader.thread.join(WAIT_S)
    assert reader.text() == "".join(lines) + "end\n"
    # Unless the worker claimed the job first, the follow said it had not started.
    assert follow.stderr.read() in (b"", b"queuectl: note: job 'f1' has not started: pending, due now; "
                                         b"its output will follow when it runs\n")
    assert state_of(db, "f1") == "completed"


def test_logs_follow_of_a_job_not_started_says_what_holds_it_then_follows(db, workers, tmp_path):
    ok(db, "pause", "--queue", "night")
    enqueue(db, id="n", command="echo night", queue="night", cwd=str(tmp_path))
    follow = workers.spawn("logs", "n", "--follow")
    err = LineReader(follow.stderr)
    wait_for(lambda: err.lines, "the note on stderr")
    assert err.lines == ["queuectl: note: job 'n' has not started: pending, held by its paused queue 'night'; "
                         "its output will follow when it runs\n"]
    assert follow.poll() is None  # still following
    ok(db, "resume", "--queue", "night")
    workers.start("--burst")
    assert follow.wait(timeout=WAIT_S) == 0
    assert follow.stdout.read() == b"night\n"
    assert err.lines == err.lines[:1]


def test_what_holds_a_job_that_has_not_started(store):
    register(store)
    store.enqueue([spec("dep"), spec("after", depends_on=["dep"]), spec("later", run_at=T0 + 240),
                   spec("p", queue="night"), spec("busy", queue="one"), spec("full", queue="one")], T0)
    store.pause(["night"])
    store.set_limit("one", 1)
    store.now = lambda: T0
    assert store.claim("w1", T0, ("one",)).id == "busy"
    held = {i: queuectl.held_by(store, store.get(i)) for i in ("dep", "after", "later", "p", "full")}
    assert held == {"dep": "due now", "after": "waiting for 1 job it depends on", "later": "due in 4m",
                    "p": "held by its paused queue 'night'", "full": "held by queue 'one' at its limit of 1 running"}


# ---- cancel --------------------------------------------------------------------------------------

def test_cancel_sends_waiting_jobs_to_the_dlq_and_flags_running_ones(store):
    register(store)
    store.enqueue([spec("run")], T0)
    running = store.claim("w1", T0)
    store.enqueue([spec("fail")], T0)
    finish_next(store, 1, T0)  # failed, retry at T0 + 2
    store.enqueue([spec("wait"), spec("child", depends_on=["wait"])], T0 + 1)
    store.cancel(["wait", "fail", "run"], T0 + 1)
    for job_id in ("wait", "fail"):
        job = store.get(job_id)
        assert (job.state, job.last_error) == ("dead", "canceled"), job_id
    child = store.get("child")
    assert child.state == "dead" and "wait" in child.last_error
    assert store.get("run").state == "processing"  # its worker kills it, then records it
    assert store.cancel_requests("w1") == {("run", 1)}
    canceled = queuectl.Outcome(None, "canceled", b"", 0.1, interrupted="canceled")
    assert store.interrupt(running, "w1", canceled, False, T0 + 2) == "dead"
    assert store.get("run").last_error == "canceled"
    assert store.runs("run")[-1]["outcome"] == "canceled"
    store.retry_dead(["wait"], T0 + 3)  # a cancel is undone by dlq retry
    assert (store.get("wait").state, store.get("wait").last_error) == ("pending", None)


def test_cancel_is_all_or_nothing_and_refuses_finished_jobs(store):
    register(store)
    store.enqueue([spec("done")], T0)
    finish_next(store, 0, T0)
    store.enqueue([spec("gone", max_retries=0)], T0)
    finish_next(store, 1, T0)
    store.enqueue([spec("p")], T0 + 1)
    for ids, error in ((["p", "done"], queuectl.Conflict), (["gone"], queuectl.Conflict),
                       (["p", "missing"], queuectl.NotFound)):
        with pytest.raises(error):
            store.cancel(ids, T0 + 2)
    assert [store.get(i).state for i in ("done", "gone", "p")] == ["completed", "dead", "pending"]


def test_cancel_wins_over_a_failure_that_beat_the_kill(store):
    register(store)
    store.enqueue([spec("j", max_retries=5)], T0)
    job = store.claim("w1", T0)
    store.cancel(["j"], T0 + 0.1)  # the worker has not seen the flag yet...
    after = store.finish(job, "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 0.2)  # ...and the job fails
    assert (after.state, after.last_error) == ("dead", "canceled")
    assert store.claim("w1", T0 + 100) is None
    store.retry_dead(["j"], T0 + 101)
    again = store.claim("w1", T0 + 101)
    assert store.finish(again, "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 102).state == "failed"


def test_a_cancel_applies_to_the_run_it_was_aimed_at(store):
    register(store)
    store.enqueue([spec("j")], T0)
    first = store.claim("w1", T0)
    store.cancel(["j"], T0)
    assert store.cancel_requests("w1") == {("j", 1)}
    canceled = queuectl.Outcome(None, "canceled", b"", 0.1, interrupted="canceled")
    assert store.interrupt(first, "w1", canceled, False, T0 + 1) == "dead"
    store.retry_dead(["j"], T0 + 2)
    second = store.claim("w1", T0 + 2)
    assert store.cancel_requests("w1") == set()
    worker = queuectl.Worker.__new__(queuectl.Worker)  # only abort_reason's state
    worker.hard, worker.registration, worker.canceled = threading.Event(), 0, {("j", 1)}
    worker.store, worker.beat_ok_at, worker.stale_s = store, time.monotonic(), 10.0
    assert worker.abort_reason(first, 0) == "canceled"
    assert worker.abort_reason(second, 0) is None  # a stale set never kills a later run


def test_cancel_pending_job_goes_to_the_dlq_and_dlq_retry_undoes_it(states_db):
    assert ok(states_db, "cancel", "wait") == "wait\n"
    job = get_job(states_db, "wait")
    assert (job["state"], job["last_error"]) == ("dead", "canceled")
    assert "wait" in [j["id"] for j in json.loads(ok(states_db, "dlq", "list", "--json"))]
    assert ok(states_db, "dlq", "retry", "wait") == "wait\n"
    job = get_job(states_db, "wait")
    assert (job["state"], job["last_error"], job["attempts"]) == ("pending", None, 0)


def test_cancel_failed_job_goes_to_the_dlq(states_db):
    assert ok(states_db, "cancel", "fail") == "fail\n"
    job = get_job(states_db, "fail")
    assert (job["state"], job["last_error"]) == ("dead", "canceled")


def test_cancel_several_at_once(states_db):
    assert ok(states_db, "cancel", "wait", "fail") == "wait\nfail\n"
    assert list_ids(states_db, "--state", "dead") == ["gone", "fail", "wait"]


def test_cancel_of_a_pending_dependency_takes_its_dependents(states_db):
    enqueue(states_db, id="child", command="true", depends_on=["wait"])
    ok(states_db, "cancel", "wait")
    child = get_job(states_db, "child")
    assert child["state"] == "dead" and "wait" in child["last_error"]


def test_cancel_of_a_processing_job_returns_at_once_and_asks_its_worker(db):
    claim_for_a_fake_worker(db, "run")
    assert ok(db, "cancel", "run") == "run\n"
    assert get_job(db, "run")["state"] == "processing"  # until its worker has killed it
    with opened(db) as s:
        assert s.cancel_requests("fake") == {("run", 1)}


@pytest.mark.parametrize("ids, named", [(["done"], "done"), (["gone"], "gone"), (["missing"], "missing"),
                                        (["wait", "done"], "done"), (["gone", "wait"], "gone"),
                                        (["wait", "missing"], "missing")],
                         ids=["completed", "dead", "unknown", "pending+completed", "dead+pending", "pending+unknown"])
def test_cancel_refuses_finished_or_unknown_jobs_changing_nothing(states_db, ids, named):
    before = snapshot(states_db)
    code, out, err = cli(states_db, "cancel", *ids)
    assert (code, out) == (1, "")
    assert_one_error(err, named)
    assert snapshot(states_db) == before


def test_cancel_then_retry_on_an_idle_worker_runs_the_job_once_more(db, workers, tmp_path):
    command = "if [ -e canceled-once ]; then echo again; else touch canceled-once started; sleep 60; fi"
    enqueue(db, id="c", command=command, cwd=str(tmp_path))
    worker = workers.start()
    _wait_started(tmp_path)
    ok(db, "cancel", "c")
    wait_for(lambda: state_of(db, "c") == "dead", "the cancel to land")
    worker.wait_log("job c -> dead (canceled (terminated))")  # the worker is idle from here on
    ok(db, "dlq", "retry", "c")
    wait_for(lambda: state_of(db, "c") == "completed", "the retried job to complete")
    runs = json.loads(ok(db, "show", "c", "--json"))["runs"]
    assert [r["outcome"] for r in runs] == ["canceled", "completed"]
    assert worker.popen.poll() is None


def test_cancel_kills_a_running_job_and_sends_it_to_the_dlq(db, workers, tmp_path):
    command = 'echo $$ > sh.pid; sleep 30 & echo $! > sleep.pid; wait'
    enqueue(db, id="c1", command=command, max_retries=3, cwd=str(tmp_path))
    worker = workers.start()
    pids = {}
    for name in ("sh.pid", "sleep.pid"):
        path = tmp_path / name
        wait_for(lambda: path.exists() and path.read_text().strip(), f"{name} to be written")
        pids[name] = int(path.read_text())
    result = script(db, "cancel", "c1")
    assert (result.returncode, result.stdout) == (0, "c1\n"), result.stderr
    wait_for(lambda: state_of(db, "c1") == "dead", "the canceled job to reach the DLQ", timeout=15)
    job = get_job(db, "c1")
    assert job["last_error"] == "canceled (terminated)"  # SIGTERM (kill-grace) ended it
    assert job["runs"][-1]["outcome"] == "canceled"
    for name, pid in pids.items():
        wait_for(lambda: pid_gone(pid), f"{name} {pid} to be killed", timeout=10)
    assert worker.popen.poll() is None  # the worker goes on with other jobs
    enqueue(db, id="after", command="true", cwd=str(tmp_path))
    wait_for(lambda: state_of(db, "after") == "completed", "the next job to run")


def test_cancel_all_of_a_queue_cancels_what_has_not_finished(db):
    dead_chain_db(db)
    now = time.time()
    with opened(db) as s:
        s.enqueue([spec("p1"), spec("run"), spec("dep", queue="q3", depends_on=["p1"])], now)
        assert s.claim("w1", now, ("default",)).id == "p1"  # p1 runs; run and dep wait
        s.retry_dead(["root", "child"], now)  # root pending, child waiting on it
    assert ok(db, "cancel", "--all", "--queue", "default") == "root\np1\nrun\n"
    states = {j["id"]: (j["state"], j["last_error"]) for j in json.loads(ok(db, "list", "--json"))}
    assert states["root"] == states["run"] == ("dead", "canceled")
    assert states["p1"] == ("processing", None)  # its worker kills it and records the cancel
    assert states["child"] == ("dead", "dependency root is dead")  # another queue: the dependency rule
    assert states["wait"] == ("pending", None) and states["fine"][0] == "completed"
    with opened(db) as s:
        assert s.cancel_requests("w1") == {("p1", 1)}
    assert ok(db, "cancel", "--all") == "wait\np1\ndep\n"
    assert {j["id"]: j["last_error"] for j in json.loads(ok(db, "list", "--json"))}["dep"] == "canceled"
    assert ok(db, "cancel", "--all") == "p1\n"  # still running: asked again


def test_postgres_cancel_all_cancels_a_job_whose_run_failed_meanwhile(pg_url):
    import psycopg

    def run_fails(_):
        # y's run fails and its worker records a retry (as finish() does); a worker whose write waits
        # for a lock tries again later, so a short lock timeout stands in for it.
        with psycopg.connect(s._libpq, autocommit=True) as worker:
            worker.execute(f'SET search_path TO "{s.schema}"; SET lock_timeout = 300')
            try:
                worker.execute("UPDATE jobs SET state = 'failed', worker_id = NULL WHERE id = 'y'")
            except psycopg.errors.LockNotAvailable:
                pass  # cancel --all holds y: the worker records its result after the cancel
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        register(s)
        s.enqueue([spec("y"), spec("z")], T0)
        assert s.claim("w1", T0).id == "y"
        assert while_rows_locked(s, ["z"], lambda mine: mine.cancel_all(None, T0 + 1), run_fails) == ["y", "z"]
        assert s.get("z").state == "dead"
        # y: still running, its worker asked to kill it (a cancel names the run it is aimed at)
        assert s.read("SELECT state, cancel_requested FROM jobs WHERE id = 'y'") == [("processing", 1)]


def test_cancel_and_timeout_with_the_default_grace_end_to_end(db, workers, tmp_path):
    enqueue(db, id="t", command=f"trap 'touch {tmp_path}/t.trapped; exit 0' TERM; sleep 30 & wait", timeout=2,
            max_retries=0)
    enqueue(db, id="c", command=f"trap 'touch {tmp_path}/c.trapped; exit 0' TERM; touch {tmp_path}/c.started; "
            "sleep 30 & wait", max_retries=0)
    workers.start("--count", "2")
    wait_for(lambda: (tmp_path / "c.started").exists(), "c to start")
    ok(db, "cancel", "c")
    wait_for(lambda: state_of(db, "t") == "dead" and state_of(db, "c") == "dead", "both jobs to end")
    assert get_job(db, "t")["last_error"] == "timed out after 2s (terminated)"
    assert get_job(db, "c")["last_error"] == "canceled (terminated)"
    assert (tmp_path / "t.trapped").exists() and (tmp_path / "c.trapped").exists()


def test_a_cancel_during_a_timeouts_grace_sends_the_job_to_the_dlq(db, workers, tmp_path):
    ok(db, "config", "set", "kill-grace", "5")
    enqueue(db, id="t", command=f"trap 'touch {tmp_path}/term' TERM; while :; do sleep 0.05; done", timeout=2,
            max_retries=5)
    workers.start()
    wait_for(lambda: (tmp_path / "term").exists(), "the timed-out job to get SIGTERM")
    ok(db, "cancel", "t")  # the job ignores SIGTERM: it is in its grace until SIGKILL comes
    wait_for(lambda: state_of(db, "t") == "dead", "the canceled job to reach the DLQ")
    job = get_job(db, "t")  # the timeout was its first attempt; the cancel wins over a retry
    assert (job["last_error"], job["attempts"], len(job["runs"])) == ("canceled", 1, 1)


def test_canceling_a_job_with_its_dependent_says_canceled_for_both_as_cancel_all_does(store):
    """`cancel a b`, b depending on a: b is canceled, not sent to the DLQ as a dead job's dependent
    before its own cancel is reached (cancel() now shares cancel --all's order: dependents last)."""
    store.enqueue([spec("a"), spec("b", depends_on=["a"])], T0)
    store.cancel(["a", "b"], T0 + 1)
    assert [(j.id, j.state, j.last_error) for j in store.list_jobs()] == [("a", "dead", "canceled"),
                                                                         ("b", "dead", "canceled")]


# ---- on_dead: a notification job for each death --------------------------------------------------

def notices(store, job_id=None):
    """The notification jobs (of the dead job `job_id`, or all), by id."""
    return {j.id: j for j in store.list_jobs() if "QUEUECTL_DEAD_RUN" in j.env
            and job_id in (None, j.env["QUEUECTL_DEAD_JOB_ID"])}


def only_notice(store, job_id):
    """The one notification job of `job_id`'s deaths so far (asserted to be the only one)."""
    made = notices(store, job_id)
    assert len(made) == 1, made
    return next(iter(made.values()))


def test_each_kind_of_death_makes_one_notification_job_with_the_dead_jobs_facts(store):
    register(store)
    store.config_set("on_dead", "notify")
    store.enqueue([spec("failed", max_retries=1), spec("timed-out", max_retries=1), spec("waiting"),
                   spec("running"), spec("lost"), spec("parent", max_retries=1),
                   spec("child", depends_on=["parent"]), spec("fine")], T0)
    store.cancel(["waiting"], T0)
    finish_next(store, 3, T0)  # failed: retries exhausted
    job = store.claim("w1", T0)  # timed-out: killed by its timeout, for good
    store.finish(job, "w1", outcome(None, "timeout after 1s", "slow"), SETTINGS, T0 + 1)
    running = store.claim("w1", T0)
    store.cancel(["running"], T0)
    store.interrupt(running, "w1", queuectl.Outcome(None, "canceled", b"", 0.1, interrupted="canceled"), False, T0)
    for _ in range(queuectl.LOST_WORKER_CAP):  # lost too often
        store.interrupt(store.claim("w1", T0), "w1", LOST, True, T0)
    finish_next(store, 1, T0)  # parent dies, and takes child with it
    finish_next(store, 0, T0)  # fine: completed, no notification
    dead = {j.id: j for j in store.list_jobs("dead")}
    assert sorted(dead) == ["child", "failed", "lost", "parent", "running", "timed-out", "waiting"]
    assert len(notices(store)) == len(dead)
    for job_id, job in dead.items():
        notice = only_notice(store, job_id)
        seq = store.read(f"SELECT seq FROM jobs WHERE id = {store.sql.PARAM}", (job_id,))[0][0]
        assert notice.id == f"{job_id}@dead-{seq}-0" and notice.command == "notify"
        assert (notice.state, notice.queue, notice.cwd, notice.max_retries) == ("pending", "default", "/", 3)
        assert notice.env == {"QUEUECTL_DEAD_JOB_ID": job_id, "QUEUECTL_DEAD_QUEUE": "default",
                              "QUEUECTL_DEAD_ATTEMPTS": str(job.attempts),
                              "QUEUECTL_DEAD_EXIT_CODE": "" if job.exit_code is None else str(job.exit_code),
                              "QUEUECTL_DEAD_ERROR": job.last_error, "QUEUECTL_DEAD_RUN": str(job.run_count)}
    assert only_notice(store, "failed").env["QUEUECTL_DEAD_EXIT_CODE"] == "3"
    assert only_notice(store, "child").env["QUEUECTL_DEAD_ERROR"] == "dependency parent is dead"


def test_a_notification_tells_the_exit_code_and_output_of_the_run_that_died_not_an_earlier_ones(store):
    """A death with no run of its own (canceled while waiting for a retry, behind a dead dependency) tells
    no exit code and no run (stdin empty); a canceled or lost run tells its own run and output, and no
    exit code (it has none), whatever an earlier attempt exited with."""
    register(store)
    store.config_set("on_dead", "notify")
    store.enqueue([spec(job_id, max_retries=3, queue=job_id) for job_id in ("waiting", "running", "lost")], T0)
    for _ in range(3):
        finish_next(store, 3, T0, output="earlier attempt")  # each failed once: exit 3, a retry due later
    store.cancel(["waiting"], T0)
    canceled = store.claim("w1", T0 + 10, ("running",))
    store.cancel(["running"], T0 + 10)
    store.interrupt(canceled, "w1", queuectl.Outcome(None, "canceled", b"canceled run", 0.1, interrupted="canceled"),
                    False, T0 + 10)
    for _ in range(queuectl.LOST_WORKER_CAP):
        store.interrupt(store.claim("w1", T0 + 10, ("lost",)), "w1", LOST, True, T0 + 10)
    facts = {job_id: (n.env["QUEUECTL_DEAD_EXIT_CODE"], n.env["QUEUECTL_DEAD_RUN"], store.dead_output(n))
             for job_id in ("waiting", "running", "lost") for n in [only_notice(store, job_id)]}
    assert facts == {"waiting": ("", "0", b""), "running": ("", "2", b"canceled run"),
                     "lost": ("", str(1 + queuectl.LOST_WORKER_CAP), b"")}
    assert store.get("running").exit_code is None  # the job's row says the same as its notification


def test_a_jobs_own_queuectl_dead_run_variable_of_any_value_reads_no_output_and_raises_nothing(store):
    """Only a notification job gets a dead run's output; a job's env is the user's, and on PostgreSQL a
    value that is no number must not become a cast error of the read (the job would die of it)."""
    store.enqueue([spec(f"fake{i}", env={"QUEUECTL_DEAD_RUN": value, "QUEUECTL_DEAD_JOB_ID": "fake0"})
                   for i, value in enumerate(["1", "x", "99999999999999999999", " 1", ""])], T0)
    assert [store.dead_output(store.get(f"fake{i}")) for i in range(5)] == [None] * 5


def test_a_notification_id_is_cut_to_the_id_limit_and_a_death_is_never_notified_twice(store):
    register(store)
    store.config_set("on_dead", "notify")
    long_id = "x" * queuectl.MAX_ID_CHARS
    store.enqueue([spec(long_id)], T0)
    store.cancel([long_id], T0)
    notice = only_notice(store, long_id)
    assert len(notice.id) == queuectl.MAX_ID_CHARS and notice.id.endswith("@dead-1-0")
    # The same death seen again (a statement that set it dead twice) inserts nothing more: one per death.
    store.write(lambda cur: cur.execute(f"UPDATE jobs SET state = 'failed' WHERE id = {store.sql.PARAM}", (long_id,)))
    store.write(lambda cur: cur.execute(f"UPDATE jobs SET state = 'dead' WHERE id = {store.sql.PARAM}", (long_id,)))
    assert len(notices(store)) == 1


def test_on_dead_of_the_job_wins_over_config_and_empty_means_none(store):
    register(store)
    store.enqueue([spec("plain"), spec("own", on_dead="own-command"), spec("quiet", on_dead="")], T0)
    store.cancel(["plain"], T0)
    assert notices(store) == {}  # config on-dead is empty by default: no notification
    store.config_set("on_dead", "config-command")
    store.cancel(["own", "quiet"], T0)
    assert only_notice(store, "own").command == "own-command" and notices(store, "quiet") == {}
    assert store.get("own").on_dead == "own-command" and store.get("plain").on_dead is None
    store.enqueue([spec("later")], T0)
    store.cancel(["later"], T0)
    assert only_notice(store, "later").command == "config-command"


def test_a_notification_jobs_own_death_notifies_nobody(store):
    register(store)
    store.config_set("on_dead", "exit 1")
    store.config_set("max_retries", 1)
    store.enqueue([spec("j")], T0)
    store.cancel(["j"], T0)
    notice = only_notice(store, "j")
    assert finish_next(store, 1, T0).state == "dead" and store.get(notice.id).state == "dead"
    assert [j.id for j in store.list_jobs()] == ["j", notice.id]


def test_a_paused_or_full_queue_does_not_hold_back_its_notification_jobs(store):
    register(store)
    store.config_set("on_dead", "notify")
    store.enqueue([spec("a", queue="q"), spec("b", queue="q"), spec("c", queue="q")], T0)
    store.pause(["q"])
    assert store.claim("w1", T0) is None and not store.due_now(T0)
    store.cancel(["a"], T0)
    assert store.due_now(T0) and store.due_now(T0, ("q",))
    assert store.claim("w1", T0, ("q",)).id == only_notice(store, "a").id
    assert store.claim("w1", T0) is None  # ordinary jobs still wait
    store.resume(["q"])
    store.set_limit("q", 2)  # the notification job runs: one slot left
    assert store.claim("w1", T0).id == "b" and store.claim("w1", T0) is None  # full
    store.cancel(["c"], T0)
    assert store.claim("w1", T0).id == only_notice(store, "c").id


def test_dlq_retry_does_not_notify_the_old_death_again_and_a_new_death_notifies(store):
    register(store)
    store.config_set("on_dead", "notify")
    store.enqueue([spec("j", max_retries=1)], T0)
    finish_next(store, 1, T0)
    first = only_notice(store, "j")
    assert finish_next(store, 0, T0).id == first.id  # the notification job ran
    store.retry_dead(["j"], T0 + 1)
    assert list(notices(store, "j")) == [first.id]
    assert finish_next(store, 2, T0 + 2).state == "dead"
    made = notices(store, "j")
    assert len(made) == 2 and first.id.endswith("-0")
    second = next(j for i, j in made.items() if i != first.id)
    assert second.id == first.id[:-1] + "1" and second.env["QUEUECTL_DEAD_EXIT_CODE"] == "2"


def test_a_schedules_template_carries_on_dead_to_its_jobs(store):
    schedule = add_schedule(store, every="1h", on_dead="page-oncall")
    assert schedule.job["on_dead"] == "page-oncall"
    job = queuectl.slot_job(schedule, T0 + 3600, CONFIG_DEFAULTS_INTERNAL)
    store.enqueue([job], T0)
    assert store.get(job["id"]).on_dead == "page-oncall"


def test_a_database_upgraded_from_schema_5_notifies(db, monkeypatch):
    with monkeypatch.context() as m:  # the queuectl before on_dead
        m.setattr(queuectl, "SCHEMA_VERSION", 5)
        m.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:5])
        m.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:5])
        with opened(db) as s:
            enqueue_older(s, "old", now=s.now())
    ok(db, "config", "set", "on-dead", "notify")
    ok(db, "cancel", "old")
    assert [j["id"] for j in json.loads(ok(db, "list", "--json"))] == ["old", "old@dead-1-0"]
    assert get_job(db, "old")["on_dead"] is None


@sqlite_only
@pytest.mark.parametrize("how", ["enqueue", "batch", "add"])
def test_an_id_of_a_notification_jobs_shape_is_refused_so_none_can_take_a_deaths_id(seeded_db, how):
    """A job enqueued as x@dead-2-0 would take the id of x's notification job, which would then not be made."""
    taken = "keep@dead-1-0"
    before = snapshot(seeded_db)
    args = {"enqueue": ("enqueue", json.dumps({"id": taken, "command": "true"})),
            "batch": ("enqueue", "-"), "add": ("add", "--id", taken, "--", "true")}[how]
    code, out, err = cli(seeded_db, *args, stdin=jsonl({"id": taken, "command": "true"}) if how == "batch" else None)
    assert (code, out) == (2, ""), err
    assert "reserved" in err and snapshot(seeded_db) == before
    for fine in ("keep@dead-1", "keep@dead-letter-0", "keep@dead-1-0x"):  # other ids with '@dead-' are anyone's
        ok(seeded_db, "add", "--id", fine, "--", "true")


@sqlite_only
@pytest.mark.parametrize("args, fragment", [
    (("enqueue", '{"command": "true", "on_dead": 5}'), "must be a string"),
    (("enqueue", '{"command": "true", "on_dead": ["mail"]}'), "must be a string"),
    (("enqueue", '{"command": "true", "on_dead": "a\\u0000b"}'), "NUL"),
    (("enqueue", json.dumps({"command": "true", "on_dead": "x" * 131_072})), "longer than 131071 bytes"),
    (("add", "--on-dead", "x" * 131_072, "--", "true"), "longer than 131071 bytes"),
    (("config", "set", "on-dead", "x" * 131_072), "longer than 131071 bytes"),
    (("schedule", "add", '{"id": "s", "every": "1h", "command": "true", "on_dead": 1}'), "must be a string"),
])
def test_bad_on_dead_is_refused_and_nothing_is_stored(seeded_db, args, fragment):
    before = snapshot(seeded_db), ok(seeded_db, "schedule", "list", "--json")
    code, out, err = cli(seeded_db, *args)
    assert (code, out) == (2, ""), err
    assert_one_error(err, "on_dead" if args[0] != "config" else "on-dead", fragment)
    assert (snapshot(seeded_db), ok(seeded_db, "schedule", "list", "--json")) == before


# ---- delete --------------------------------------------------------------------------------------

def test_delete_removes_jobs_with_their_runs_and_dependencies(store):
    register(store)
    store.enqueue([spec("a")], T0)
    finish_next(store, 0, T0)
    store.enqueue([spec("b", depends_on=["a"])], T0)
    store.delete(["b", "a"])
    assert store.list_jobs() == []
    assert store.runs("a") == [] and store.depends_on("b") == []
    store.enqueue([spec("a")], T0 + 1)  # the id is free again, with an empty history
    assert store.get("a").run_count == 0 and store.runs("a") == []


def test_delete_refuses_processing_and_needed_jobs_all_or_nothing(store):
    register(store)
    store.enqueue([spec("run")], T0)
    store.claim("w1", T0)
    store.enqueue([spec("dep"), spec("user", depends_on=["dep"]), spec("free")], T0)
    with pytest.raises(queuectl.Conflict, match="run"):
        store.delete(["free", "run"])
    with pytest.raises(queuectl.Conflict, match="user"):
        store.delete(["free", "dep"])
    with pytest.raises(queuectl.NotFound):
        store.delete(["free", "missing"])
    assert sorted(j.id for j in store.list_jobs()) == ["dep", "free", "run", "user"]
    store.delete(["dep", "user"])  # together: nothing unfinished is left needing dep
    assert sorted(j.id for j in store.list_jobs()) == ["free", "run"]


def test_a_dependency_that_a_dead_job_still_needs_is_not_deleted(store):
    # Deleting it would let `dlq retry` of the dependent run without it (its edge would be gone).
    register(store)
    store.enqueue([spec("a", run_at=T0 + 60), spec("b", depends_on=["a"])], T0)
    store.cancel(["a"], T0)
    assert (store.get("a").state, store.get("b").state) == ("dead", "dead")
    with pytest.raises(queuectl.Conflict, match="'a' is needed by .*b"):
        store.delete(["a"])
    store.retry_dead(["a", "b"], T0 + 1)
    assert store.get("b").waiting_on == 1  # still waits for a
    finish_next(store, 0, T0 + 60)
    store.delete(["a"])  # completed: b no longer needs it
    assert finish_next(store, 0, T0 + 61).id == "b"


def test_delete_removes_jobs_and_their_runs(states_db):
    assert run_counts(states_db) == {"done": 1, "gone": 1, "fail": 1}
    assert ok(states_db, "delete", "done", "gone", "wait") == "done\ngone\nwait\n"
    assert list_ids(states_db) == ["fail"]
    assert run_counts(states_db) == {"fail": 1}
    for job_id in ("done", "gone", "wait"):
        assert cli(states_db, "show", job_id)[0] == 1
    enqueue(states_db, id="done", command="true")  # the id can be used again, with a fresh history
    assert get_job(states_db, "done")["runs"] == []


def test_delete_of_a_processing_job_exits_1(states_db):
    claim_for_a_fake_worker(states_db, "run")
    before = snapshot(states_db)
    code, out, err = cli(states_db, "delete", "wait", "run")
    assert (code, out) == (1, "")
    assert_one_error(err, "run")
    assert snapshot(states_db) == before


def test_delete_of_a_job_unfinished_jobs_depend_on_exits_1_naming_them(states_db):
    enqueue(states_db, id="child", command="true", depends_on=["wait"])
    enqueue(states_db, id="grandchild", command="true", depends_on=["wait"])
    before = snapshot(states_db)
    code, out, err = cli(states_db, "delete", "wait")
    assert (code, out) == (1, "")
    assert_one_error(err, "wait", "child", "grandchild")
    assert snapshot(states_db) == before
    assert ok(states_db, "delete", "grandchild", "child", "wait") == "grandchild\nchild\nwait\n"
    assert list_ids(states_db) == ["done", "gone", "fail"]


@pytest.mark.parametrize("ids", [["done", "missing"], ["missing", "done"]])
def test_delete_removes_nothing_when_any_id_fails(states_db, ids):
    before = snapshot(states_db)
    code, out, err = cli(states_db, "delete", *ids)
    assert (code, out) == (1, "")
    assert_one_error(err, "missing")
    assert snapshot(states_db) == before


# ---- purge and retention -------------------------------------------------------------------------

def _finished_at(store, job_id, code, when, **kw):
    store.enqueue([spec(job_id, max_retries=0, **kw)], when)
    return finish_next(store, code, when)


def age(db, job_id, seconds):
    """Make a job look last updated `seconds` ago."""
    db_sql(db, "UPDATE jobs SET updated_at = ? WHERE id = ?", (time.time() - seconds, job_id))


def completed_jobs(db, count):
    """`count` completed jobs, made fast: a batch, then marked completed in one statement."""
    batch = "".join(json.dumps({"id": f"c{n}", "command": "true"}) + "\n" for n in range(count))
    assert cli(db, "enqueue", "-", stdin=batch)[0] == 0
    db_sql(db, "UPDATE jobs SET state = 'completed', ready = 0, updated_at = ?", (time.time() - 10,))


def test_purge_keeps_a_dead_job_until_no_dead_dependent_needs_it(store):
    register(store)
    store.enqueue([spec("a", run_at=T0 + 60), spec("b", depends_on=["a"])], T0)
    store.cancel(["a"], T0)
    assert store.purge("dead", T0 + 1) == 1  # b goes; a stays while b exists
    assert [j.id for j in store.list_jobs()] == ["a"]
    assert store.purge("dead", T0 + 1) == 1
    assert store.list_jobs() == []


def test_purge_removes_old_jobs_of_one_state_and_their_runs(store):
    register(store)
    _finished_at(store, "old-done", 0, T0)
    _finished_at(store, "old-dead", 1, T0)
    _finished_at(store, "new-done", 0, T0 + 100)
    store.enqueue([spec("pending")], T0)
    assert store.purge("completed", T0 + 50, limit=5000) == 1
    assert sorted(j.id for j in store.list_jobs()) == ["new-done", "old-dead", "pending"]
    assert store.runs("old-done") == [] and len(store.runs("old-dead")) == 1
    assert store.purge("dead", T0 + 50) == 1
    assert store.purge("completed", T0 + 1000) == 1
    assert [j.id for j in store.list_jobs()] == ["pending"]


def test_purge_limit_bounds_one_slice(store):
    register(store)
    for i in range(5):
        _finished_at(store, f"d{i}", 0, T0)
    assert store.purge("completed", T0 + 1, limit=2) == 2
    assert store.purge("completed", T0 + 1, limit=2) == 2
    assert store.purge("completed", T0 + 1, limit=2) == 1


def test_retention_deletes_old_completed_jobs_only(tmp_path):
    path = str(tmp_path / "ret.db")
    now = time.time()
    with opened(path) as s:
        register(s, now=now - 3 * 86400)
        _finished_at(s, "done-3d", 0, now - 3 * 86400)
        _finished_at(s, "dead-3d", 1, now - 3 * 86400)
        _finished_at(s, "done-1h", 0, now - 3600)
    worker = queuectl.Worker(path, 1, False)
    try:
        worker._apply_retention()  # default 7d: all are younger
        assert len(worker.store.list_jobs()) == 3
        worker.store.config_set("retention", 0)  # 0 keeps forever
        worker._apply_retention()
        assert len(worker.store.list_jobs()) == 3
        worker.store.config_set("retention", 86400)
        worker._apply_retention()
        assert [j.id for j in worker.store.list_jobs()] == ["dead-3d", "done-1h"]
        assert worker.store.runs("done-3d") == []
        assert len(worker.store.runs("dead-3d")) == 1  # dead jobs stay until purged
    finally:
        worker.store.close()


def test_purge_deletes_in_short_transactions(store, monkeypatch):
    register(store)
    for i in range(25):
        store.enqueue([spec(f"j{i}")], T0)
        finish_next(store, 0, T0)
    monkeypatch.setattr(queuectl, "PURGE_SLICE", 10)
    slices = []
    real_purge = queuectl.Store.purge
    monkeypatch.setattr(queuectl.Store, "purge", lambda self, *a: slices.append(a) or real_purge(self, *a))
    assert store.purge_in_slices("completed", T0 + 1) == 25
    assert [n for (_, _, n) in slices] == [10, 10, 10] and store.list_jobs() == []


def test_purge_removes_completed_jobs_by_default(states_db):
    assert cli(states_db, "purge", "--older-than", "0") == (0, "purged 1 completed job\n", "")
    assert list_ids(states_db) == ["gone", "fail", "wait"]
    assert "done" not in run_counts(states_db)
    assert ok(states_db, "purge", "--state", "completed") == "purged 0 completed jobs\n"


def test_purge_state_dead(states_db):
    assert ok(states_db, "purge", "--state", "dead") == "purged 1 dead job\n"
    assert list_ids(states_db) == ["done", "fail", "wait"]
    assert "gone" not in run_counts(states_db)


def test_purge_older_than_keeps_recent_jobs(states_db):
    enqueue(states_db, id="done2", command="true", priority=1000)
    with opened(states_db) as s:
        register(s, now=time.time())
        assert finish_next(s, 0, time.time()).id == "done2"  # completed just now
        s.deregister("w1")
    age(states_db, "done", 2 * 3600)
    age(states_db, "gone", 2 * 3600)
    assert ok(states_db, "purge", "--older-than", "1h") == "purged 1 completed job\n"
    assert list_ids(states_db, "--state", "completed") == ["done2"]
    assert ok(states_db, "purge", "--older-than", "3h", "--state", "dead") == "purged 0 dead jobs\n"
    assert ok(states_db, "purge", "--older-than", "90m", "--state", "dead") == "purged 1 dead job\n"
    assert ok(states_db, "purge", "--older-than", "1d") == "purged 0 completed jobs\n"
    assert list_ids(states_db) == ["fail", "wait", "done2"]


@sqlite_only
@pytest.mark.parametrize("args", [("--older-than", "1y"), ("--older-than", "-1h"), ("--older-than", "abc"),
                                  ("--older-than", ""), ("--older-than", "99999d"), ("--state", "pending"),
                                  ("--state", "failed"), ("--state", "processing")])
def test_purge_bad_arguments_exit_2(states_db, args):
    before = snapshot(states_db)
    code, out, err = cli(states_db, "purge", *args)
    assert_argparse_error(code, err)
    assert out == ""
    assert snapshot(states_db) == before


@sqlite_only
@pytest.mark.parametrize("number", ["7", "3600", "1.5"])
def test_purge_refuses_an_age_without_a_unit(states_db, number):
    before = snapshot(states_db)
    code, out, err = cli(states_db, "purge", "--older-than", number)
    assert (code, out) == (2, "")
    assert_one_error(err, f"argument --older-than: {number!r} has no unit", f"{number}s", f"{number}d")
    assert snapshot(states_db) == before
    assert ok(states_db, "purge", "--older-than", f"{number}d") == "purged 0 completed jobs\n"
    assert ok(states_db, "wait", "done", "--timeout", number) == ""  # elsewhere a bare number is seconds


@sqlite_only
def test_purge_suggests_no_unit_for_a_negative_age(states_db):
    code, out, err = cli(states_db, "purge", "--older-than", "-7")
    assert (code, out) == (2, "")
    assert_one_error(err, "argument --older-than: not a duration: '-7'")


def test_purge_without_older_than_or_state_exits_2_naming_them(states_db):
    before = snapshot(states_db)
    code, out, err = cli(states_db, "purge")
    assert (code, out) == (2, "")
    assert_one_error(err, "--older-than", "--state")
    assert snapshot(states_db) == before
    assert "needs --older-than, --state or both" in ok(states_db, "purge", "--help")
    assert ok(states_db, "purge", "--older-than", "1h") == "purged 0 completed jobs\n"  # completed by default


@sqlite_only
@pytest.mark.parametrize("text, seconds", [("1s", 1), ("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800),
                                           ("0", 0), ("45", 45)])
def test_config_retention_takes_durations(db, text, seconds):
    ok(db, "config", "set", "retention", text)
    assert json.loads(ok(db, "config", "list", "--json"))["retention"] == seconds


@sqlite_only
@pytest.mark.parametrize("value", ["-1", "1y", "abc", "", "nan", "99999d"])
def test_config_retention_rejects_bad_values(seeded_db, value):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "config", "set", "retention", value)
    assert (code, out) == (2, ""), err
    assert_one_error(err)
    assert snapshot(seeded_db) == before


def test_a_worker_deletes_completed_jobs_older_than_retention(db, workers, tmp_path):
    enqueue(db, id="old", command="echo old", cwd=str(tmp_path))
    enqueue(db, id="bad", command="exit 1", max_retries=0, cwd=str(tmp_path))
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    finished = parse_iso(get_job(db, "old")["updated_at"]).timestamp()
    wait_for(lambda: time.time() > finished + 1.5, "the completed job to be over 1 s old")
    ok(db, "config", "set", "retention", "0")  # 0 keeps forever
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    assert list_ids(db) == ["old", "bad"]
    ok(db, "config", "set", "retention", "1s")
    worker = workers.start("--burst")  # checks retention as it starts
    assert worker.wait() == 0, worker.log()
    assert list_ids(db) == ["bad"]  # dead jobs stay until purged
    assert "old" not in run_counts(db)


def test_purge_in_slices_counts_on_a_terminal_and_erases_the_line(db, terminal):
    completed_jobs(db, 2 * queuectl.PURGE_SLICE + 1)
    code, out, raw = terminal(db, "purge", "--state", "completed").finish()
    assert (code, out) == (0, f"purged {2 * queuectl.PURGE_SLICE + 1} completed jobs\n")
    assert f"\rpurge: {queuectl.PURGE_SLICE} completed jobs deleted so far\x1b[K" in raw
    assert screen(raw) == []


def test_purge_off_a_terminal_or_in_one_slice_writes_nothing_extra(db, terminal):
    completed_jobs(db, 5)
    code, out, raw = terminal(db, "purge", "--state", "completed").finish()
    assert (code, out, raw) == (0, "purged 5 completed jobs\n", "")
    completed_jobs(db, queuectl.PURGE_SLICE + 1)
    result = script(db, "purge", "--state", "completed")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"purged {queuectl.PURGE_SLICE + 1} completed "
                                                                    "jobs\n", "")


# ---- stats ---------------------------------------------------------------------------------------

def build_history(store, base):
    """Known runs: completed in 1 s and 2 s (waits 5, 0), then f1 failed in 3 s and dead in 10 s
    (waits 1, 4), all ending by base + 160; p1 pending since base + 170."""
    register(store, now=base)
    store.enqueue([spec("c1")], base)
    finish_next(store, 0, base + 5, ended=base + 6)
    store.enqueue([spec("c2")], base + 10)
    finish_next(store, 0, base + 10, ended=base + 12)
    store.enqueue([spec("f1", max_retries=2)], base + 140)
    assert finish_next(store, 1, base + 141, ended=base + 144).state == "failed"  # due again at base + 146
    assert finish_next(store, 1, base + 150, ended=base + 160).state == "dead"
    store.enqueue([spec("p1")], base + 170)
    store.deregister("w1")


def test_stats_over_a_known_history(store):
    build_history(store, T0)
    stats = store.stats(T0, T0 + 180)
    assert {k: stats["outcomes"].get(k, 0) for k in ("completed", "failed", "dead")} == \
        {"completed": 2, "failed": 1, "dead": 1}
    assert stats["duration"] == pytest.approx((10, 2, 10))  # max, p50, p95 of 1, 2, 3, 10
    assert stats["wait"][1:] == pytest.approx((1, 5))  # p50, p95 of 0, 1, 4, 5
    assert stats["oldest_eligible_age_s"] == pytest.approx(10)
    recent = store.stats(T0 + 100, T0 + 180)
    assert {k: recent["outcomes"].get(k, 0) for k in ("completed", "failed", "dead")} == \
        {"completed": 0, "failed": 1, "dead": 1}


def test_a_run_at_before_the_enqueue_counts_the_wait_from_the_enqueue(store):
    # run_at 1 is 1970: the job has waited since it was enqueued, not for 56 years.
    store.enqueue([spec("now")], T0)
    store.enqueue([spec("past", run_at=1.0, max_retries=2)], T0 + 1)
    assert store.stats(T0, T0 + 5)["oldest_eligible_age_s"] == pytest.approx(5)  # "now", waiting since T0
    store.delete(["now"])
    assert store.stats(T0, T0 + 5)["oldest_eligible_age_s"] == pytest.approx(4)
    families = prometheus_families(queuectl.metrics_text(store, T0 + 5))
    assert sample(families, "queuectl_oldest_due_age_seconds", queue="default") == pytest.approx(4)
    store.enqueue([spec("now")], T0 + 2)
    register(store, now=T0)
    assert claim_ids(store, T0 + 6) == ["past", "now"]  # the claim order still goes by run_at
    store.finish(store.get("past"), "w1", outcome(1, "exit code 1"), SETTINGS, T0 + 7)  # retried from T0 + 9
    store.finish(store.get("now"), "w1", outcome(), SETTINGS, T0 + 7)
    assert store.stats(T0, T0 + 10)["oldest_eligible_age_s"] == pytest.approx(1)
    finish_next(store, 0, T0 + 12)
    assert [run["due_at"] for run in store.runs("past")] == [T0 + 1, T0 + 9]
    assert sorted(t[1] for t in store.read(store.sql.SQL_STATS_TIMES, (T0,))) == pytest.approx([3, 4, 5])
    assert store.stats(T0, T0 + 12)["wait"] == pytest.approx((5, 4, 5))  # max, p50, p95


def test_stats_of_an_empty_db(db):
    stats = json.loads(ok(db, "stats", "--json"))
    assert STATS_KEYS <= stats.keys()
    assert stats["window_s"] == 3600
    assert stats["runs"] == {"completed": 0, "failed": 0, "dead": 0}
    assert stats["throughput_per_min"] == 0
    assert stats["oldest_eligible_age_s"] is None


def test_stats_over_a_known_history_cli(db):
    now = time.time()
    with opened(db) as s:
        build_history(s, now - 180)  # c1, c2 ended ~170 s ago; f1's two runs 36 and 20 s ago
    stats = json.loads(ok(db, "stats", "--json"))
    assert STATS_KEYS <= stats.keys()
    assert stats["window_s"] == 3600
    assert stats["runs"] == {"completed": 2, "failed": 1, "dead": 1}
    assert stats["throughput_per_min"] == pytest.approx(4 / 60, abs=0.001)
    assert {"p50", "p95", "max"} <= stats["duration_s"].keys() and {"p50", "p95"} <= stats["wait_s"].keys()
    assert stats["duration_s"]["p50"] == pytest.approx(2) and stats["duration_s"]["max"] == pytest.approx(10)
    assert stats["duration_s"]["p95"] == pytest.approx(10)
    assert stats["wait_s"]["p50"] == pytest.approx(1) and stats["wait_s"]["p95"] == pytest.approx(5)
    assert 10 <= stats["oldest_eligible_age_s"] <= 10 + WAIT_S
    recent = json.loads(ok(db, "stats", "--since", "1m", "--json"))
    assert recent["window_s"] == 60
    assert recent["runs"] == {"completed": 0, "failed": 1, "dead": 1}
    assert recent["duration_s"]["max"] == pytest.approx(10) and recent["duration_s"]["p50"] == pytest.approx(3)
    text = ok(db, "stats")
    for fragment in ("completed 2", "failed 1", "dead 1", "p50", "p95", "max"):
        assert fragment in text, fragment


@sqlite_only
@pytest.mark.parametrize("since", ["abc", "-1h", "1y", "", "99999d", "1h30m"])
def test_stats_bad_since_exits_2(db, since):
    code, out, err = cli(db, "stats", "--since", since, "--json")
    assert_argparse_error(code, err)
    assert out == ""


@sqlite_only
@pytest.mark.parametrize("since", ["-1h", "0", "0s", "-5"])
def test_stats_refuses_a_negative_or_zero_window_saying_so(db, since):
    code, out, err = cli(db, "stats", "--since", since)
    assert (code, out) == (2, "")
    assert_one_error(err, f"argument --since: the window must be longer than 0: {since!r}")
    assert not os.path.exists(db)


# ---- per-queue concurrency limits (`limit`, `queues`) --------------------------------------------

def _done(store, job, worker="w1"):
    """Record a claimed job as completed."""
    assert store.finish(job, worker, queuectl.Outcome(0, None, b"", 0.1), SETTINGS, T0) is not None


def _pg_buffers(store, sql, params, generic=False) -> int:
    """Shared buffers a PostgreSQL statement touches (EXPLAIN ANALYZE, rolled back): exact, unlike time.
    generic: in the plan a statement prepared as PgPipeline prepares it may get from its sixth run on."""
    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
    with store.conn.transaction(force_rollback=True):
        if generic:
            _, text, marks = queuectl.pg_prepared(sql)
            store.conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            store.conn.execute(b"PREPARE generic AS " + text)
            cur = store.psycopg.ClientCursor(store.conn)  # EXECUTE's arguments inlined: it takes no parameters
            plan = cur.execute(explain + f"EXECUTE generic({', '.join(['%s'] * len(marks))})",
                               [params[mark] for mark in marks]).fetchone()[0][0]
            store.conn.execute("DEALLOCATE generic")
        else:
            plan = store.conn.execute(explain + sql, params).fetchone()[0][0]
    return plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]


def _waiting_for_a_lock(store) -> bool:
    with store.conn.transaction(force_rollback=True):  # a savepoint inside the test's transaction
        return bool(store.conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone())


def _concurrency(log_path) -> int:
    """The most jobs running at once, from the start/end lines the jobs appended to one file."""
    running = most = 0
    for line in log_path.read_text().split():
        running += 1 if line == "start" else -1
        most = max(most, running)
    return most


def _recording_job(log_path, at_least=1) -> str:
    """A job that appends start and end to log_path (appends of a line are atomic), and in between
    waits (at most 10 s) until `at_least` jobs have started, so that many surely overlap."""
    log = shlex.quote(str(log_path))
    return (f"echo start >> {log}; i=0; while [ $(grep -c start {log}) -lt {at_least} ] && [ $i -lt 200 ]; "
            f"do sleep 0.05; i=$((i+1)); done; sleep 0.2; echo end >> {log}")


def test_a_full_queue_gives_way_to_the_best_job_of_another(store):
    register(store)
    store.enqueue([spec(f"d{i}", queue="deploy", priority=10) for i in range(3)], T0)
    store.enqueue([spec(f"b{i}") for i in range(2)], T0)
    store.set_limit("deploy", 1)
    d0 = store.claim("w1", T0)
    assert d0.id == "d0"
    # deploy is full: the next claims take the other queue's jobs, then nothing, though d1 is best
    assert [store.claim("w1", T0).id for _ in range(2)] == ["b0", "b1"]
    assert store.claim("w1", T0) is None
    assert store.claim("w1", T0, ("deploy",)) is None
    _done(store, d0)
    assert store.claim("w1", T0).id == "d1"
    assert store.claim("w1", T0) is None
    store.set_limit("deploy", 2)  # raised: one more may run
    assert store.claim("w1", T0).id == "d2"
    assert store.limits() == {"deploy": 2}
    store.set_limit("deploy", None)
    assert store.limits() == {}


def test_limit_counts_every_worker_and_is_honoured_when_lowered(store):
    for worker in ("w1", "w2"):
        register(store, worker)
    store.enqueue([spec(f"d{i}", queue="deploy") for i in range(4)], T0)
    store.set_limit("deploy", 2)
    d0, d1 = store.claim("w1", T0), store.claim("w2", T0)
    assert (d0.id, d1.id) == ("d0", "d1")
    assert store.claim("w2", T0) is None and store.claim("w1", T0) is None
    store.set_limit("deploy", 1)  # two still run: no new one until fewer than one do
    _done(store, d0, "w1")
    assert store.claim("w1", T0) is None
    _done(store, d1, "w2")
    assert store.claim("w2", T0).id == "d2"


@pytest.mark.parametrize("queues", [(), ("deploy", "default")])
def test_limit_holds_on_sqlite_without_returning(sqlite_store, monkeypatch, queues):
    monkeypatch.setattr(queuectl, "HAS_RETURNING", False)  # SQLite < 3.35: choose, then update
    register(sqlite_store)
    sqlite_store.enqueue([spec("d1", queue="deploy", priority=5), spec("d2", queue="deploy", priority=5),
                          spec("o1")], T0)
    sqlite_store.set_limit("deploy", 1)
    assert [sqlite_store.claim("w1", T0, queues).id for _ in range(2)] == ["d1", "o1"]
    assert sqlite_store.claim("w1", T0, queues) is None


def test_limits_keep_priority_due_time_pause_and_dependencies(store):
    register(store)
    store.set_limit("deploy", 5)
    store.enqueue([spec("later", queue="deploy", priority=9, run_at=T0 + 60), spec("first", queue="deploy"),
                   spec("top", queue="other", priority=3)], T0)
    store.enqueue([spec("after", queue="deploy", priority=8, depends_on=["first"])], T0)
    store.pause(["other"])
    assert store.claim("w1", T0).id == "first"
    assert store.claim("w1", T0) is None  # "after" waits for "first", "later" is not due, "other" is paused
    store.resume(["other"])
    assert store.claim("w1", T0).id == "top"


def test_queues_lists_every_queue_with_jobs_a_limit_or_a_pause(store):
    register(store)
    store.enqueue([spec("a", queue="build"), spec("b", queue="build"), spec("c")], T0)
    store.set_limit("deploy", 1)
    store.pause(["nightly"])
    assert store.claim("w1", T0, ("build",)).id == "a"
    none = dict.fromkeys(STATES, 0)
    assert store.queues() == [
        {"queue": "build", "jobs": {**none, "pending": 1, "processing": 1}, "paused": False, "limit": None},
        {"queue": "default", "jobs": {**none, "pending": 1}, "paused": False, "limit": None},
        {"queue": "deploy", "jobs": none, "paused": False, "limit": 1},
        {"queue": "nightly", "jobs": none, "paused": True, "limit": None}]
    store.pause(["*"])
    assert all(q["paused"] for q in store.queues())


def test_claim_and_poll_do_not_walk_a_paused_or_full_queue_backlog(store):
    # Counted in SQLite VM instructions or PostgreSQL buffers, not seconds: a claim that walked the
    # 20,000 jobs below would cost tens of thousands of either.
    register(store)
    store.enqueue([spec(f"p{i}", queue="backfill", priority=9) for i in range(10_000)], T0)
    store.enqueue([spec(f"x{i}", queue="deploy", priority=9) for i in range(10_000)], T0)
    store.enqueue([spec("due")], T0)
    store.pause(["backfill"])
    store.set_limit("deploy", 1)
    assert store.claim("w1", T0).id == "x0"
    if isinstance(store, queuectl.PostgresStore):
        for queues in (None, ["deploy", "backfill"]):
            params = {"worker": "w1", "now": T0 + 1, "queues": queues, "held": [], "busy": []}
            for sql in (store.sql.SQL_CLAIM, store.sql.SQL_POLL):
                for generic in (False, True):
                    assert _pg_buffers(store, sql, params, generic) < 200, (sql, queues, generic)
    else:
        assert _vm_steps(store, lambda: store.due_now(T0 + 1)) < 50
        assert _vm_steps(store, lambda: store.claim("w1", T0 + 1, ("deploy", "backfill"))) < 50
    assert store.claim("w1", T0 + 1).id == "due"
    assert store.claim("w1", T0 + 1) is None and not store.due_now(T0 + 1)


def test_postgres_claims_of_a_limited_queue_wait_for_each_other_and_count_exactly(pg_url):
    # Claims from a queue limited to 1 while a first claim of it has not committed: one whose best job
    # is in an unlimited queue goes ahead at once; one whose best job is in the limited queue waits
    # for the first's lock on that queue, then sees its claim and takes the unlimited queue's job.
    first, second, third = (queuectl.PostgresStore(pg_url) for _ in range(3))
    try:
        for worker in ("w1", "w2", "w3"):
            register(first, worker)
        first.enqueue([spec("d1", queue="deploy", priority=5), spec("d2", queue="deploy", priority=5),
                       spec("o0", priority=9), spec("o1")], T0)
        first.set_limit("deploy", 1)
        claimed = {}
        with first.conn.transaction():
            claimed["w1"] = first._claim_in(first.conn.cursor(), "w1", T0, ("deploy",))
            claimed["w3"] = third.claim("w3", T0)  # would wait for the lock (then fail: Busy) if it took it
            thread = threading.Thread(target=lambda: claimed.update(w2=second.claim("w2", T0)))
            thread.start()
            wait_for(lambda: _waiting_for_a_lock(first), "the second claim to wait for the queue's lock")
        thread.join(WAIT_S)
        assert {w: job.id for w, job in claimed.items()} == {"w1": "d1", "w3": "o0", "w2": "o1"}
    finally:
        for store in (first, second, third):
            store.close()


def test_limit_and_queues_cli(db):
    assert ok(db, "limit", "deploy", "1") == "deploy: 1\n"
    assert ok(db, "limit", "build", "2") == "build: 2\n"
    assert ok(db, "limit") == "build: 2\ndeploy: 1\n"
    assert json.loads(ok(db, "limit", "--json")) == {"build": 2, "deploy": 1}
    assert ok(db, "limit", "deploy") == "deploy: 1\n"
    assert ok(db, "limit", "deploy", "none") == "deploy: none\n"
    assert json.loads(ok(db, "limit", "--json")) == {"build": 2}
    enqueue(db, id="a", command="true", queue="build")
    rows = json.loads(ok(db, "queues", "--json"))
    assert rows == [{"queue": "build", "jobs": {**dict.fromkeys(STATES, 0), "pending": 1}, "paused": False,
                     "limit": 2}]
    lines = ok(db, "queues").splitlines()
    assert lines[0].split() == ["QUEUE", *[s.upper() for s in STATES], "LIMIT", "PAUSED"]
    assert lines[1].split() == ["build", "1", "0", "0", "0", "0", "2", "no"]


@sqlite_only
@pytest.mark.parametrize("args", [("q", "0"), ("q", "-1"), ("q", "1.5"), ("q", "two"), ("q", "1000001"),
                                  ("a*", "1"), ("q", "1", "2"), ("--json", "q")])
def test_limit_rejects_bad_input_and_changes_nothing(db, args):
    ok(db, "limit", "q", "3")
    code, out, err = cli(db, "limit", *args)
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(ERROR_PREFIX)
    assert json.loads(ok(db, "limit", "--json")) == {"q": 3}


def test_limits_of_1_and_2_hold_across_workers_beside_an_unlimited_queue(db, workers, tmp_path):
    ok(db, "limit", "deploy", "1")
    ok(db, "limit", "build", "2")
    logs = {q: tmp_path / f"{q}.log" for q in ("deploy", "build", "default")}
    reach = {"deploy": 1, "build": 2, "default": 3}
    jobs = [{"id": f"{q}{i}", "command": _recording_job(logs[q], reach[q]), "queue": q}
            for q in logs for i in range(5)]
    code, _, err = cli(db, "enqueue", "-", stdin="\n".join(json.dumps(j) for j in jobs))
    assert code == 0, err
    procs = [workers.start("--count", "4", "--burst") for _ in range(2)]
    for proc in procs:
        assert proc.wait() == 0, proc.log()
    assert json.loads(ok(db, "status", "--json"))["jobs"]["completed"] == 15
    seen = {q: _concurrency(path) for q, path in logs.items()}
    assert (seen["deploy"], seen["build"]) == (1, 2) and seen["default"] >= 3, seen


def test_a_full_queue_does_not_block_the_others(db, workers, tmp_path):
    ok(db, "limit", "deploy", "1")
    enqueue(db, id="d1", command=BLOCKING_JOB, queue="deploy", cwd=str(tmp_path))
    workers.start("--count", "2")
    wait_for(lambda: (tmp_path / "started").exists(), "d1 to start")
    enqueue(db, id="d2", command="true", queue="deploy", priority=10)  # the best job, in a full queue
    for i in range(3):
        enqueue(db, id=f"o{i}", command="true")
    wait_for(lambda: all(state_of(db, f"o{i}") == "completed" for i in range(3)), "the other queue's jobs")
    assert (state_of(db, "d1"), state_of(db, "d2")) == ("processing", "pending")
    (tmp_path / "release").touch()
    wait_for(lambda: state_of(db, "d2") == "completed", "d2 once d1 is done")


def test_postgres_a_limit_set_while_a_claim_of_its_queue_is_uncommitted_still_holds(pg_url):
    # A claim that began before `limit` committed saw no limit and took no lock; a claim after it counts
    # only committed claims. `limit` must wait for claims in flight, or the queue runs one job too many.
    first, second = queuectl.PostgresStore(pg_url), queuectl.PostgresStore(pg_url)
    try:
        for worker in ("w1", "w2"):
            register(first, worker)
        first.enqueue([spec("d1", queue="deploy"), spec("d2", queue="deploy")], T0)
        claimed, done = {}, threading.Event()

        def limit_then_claim():
            second.set_limit("deploy", 1)
            claimed["w2"] = second.claim("w2", T0)
            done.set()
        with first.conn.transaction():
            claimed["w1"] = first._claim_in(first.conn.cursor(), "w1", T0, ())
            thread = threading.Thread(target=limit_then_claim)
            thread.start()
            wait_for(lambda: done.is_set() or _waiting_for_a_lock(first), "the limit to be set or to wait")
        thread.join(WAIT_S)
        assert claimed["w1"].id == "d1" and claimed["w2"] is None
        assert first.counts()["processing"] == 1
    finally:
        for store in (first, second):
            store.close()


def test_queues_keeps_its_columns_aligned_with_a_long_queue_name(db):
    ok(db, "limit", "q" * 64, "3")
    enqueue(db, id="a", command="true", queue="short")
    header, *rows = ok(db, "queues").splitlines()
    assert len(rows) == 2 and rows[0].split()[0] == "q" * 64
    # every column ends where its heading does (the last one, PAUSED, is left-aligned)
    assert {len(line.rsplit(None, 1)[0]) for line in rows} == {len(header.rsplit(None, 1)[0])}


def test_the_claim_after_a_completion_skips_a_full_queue_and_takes_from_it_once_it_has_room(store):
    register(store, "w1")
    register(store, "w2")
    store.set_limit("lim", 1)
    store.enqueue([spec("a", priority=9), spec("l1", queue="lim"), spec("l2", queue="lim"), spec("b")], T0)
    a, l1 = store.claim("w1", T0 + 1), store.claim("w2", T0 + 1)
    assert (a.id, l1.id) == ("a", "l1")  # lim is full now
    after, following = store.finish_and_claim(a, "w1", DONE, store.config_all(), T0 + 2, ())
    assert after.state == "completed" and following.id == "b"  # l2 is older, but its queue is full
    after, following = store.finish_and_claim(l1, "w2", DONE, store.config_all(), T0 + 3, ())
    assert after.state == "completed" and (following.id, following.worker_id) == ("l2", "w2")  # l1's room
    assert [(r["run"], r["worker_id"], r["outcome"]) for r in store.runs("l2")] == [(1, "w2", None)]
    assert store.counts()["processing"] == 2 and store.get("l2").state == "processing"


# ---- PostgreSQL backend: schemas, roles and owners, URLs, notifications --------------------------

def with_password(url, password, port=None):
    """`url` with a password (and another port) in its authority."""
    from urllib.parse import urlsplit, urlunsplit
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{port or parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pg_roles(pg_url):
    """Factory of PostgreSQL roles for one test (see PgRoles), dropped at teardown."""
    roles = PgRoles(pg_url)
    try:
        yield roles
    finally:
        roles.cleanup()


def schema_tables(roles, schema):
    """{table: owner} of one schema, as the catalog has them."""
    import psycopg
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        return dict(conn.execute("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = %s", (schema,)))


def bobs_queue(roles):
    """A role bob, allowed to create schemas, and a queue he made in a schema of his with one job, `bobs`:
    (bob, the schema)."""
    bob, schema = roles.make("bob", "LOGIN"), f"{roles.prefix}_q"
    roles.sql(f"GRANT CREATE ON DATABASE {roles.dbname} TO {bob}")
    roles.sql(f"CREATE SCHEMA {schema}", role=bob)
    ok(roles.url(bob, schema), "enqueue", '{"id": "bobs", "command": "true"}')
    return bob, schema


def plant_payload(roles, owner, schema):
    """As `owner`, a function `schema.payload()` that records who ran it in `schema.ran` (which every role
    may write) and returns the schema version, for a view or a policy to call; the roles it recorded."""
    roles.sql(f"CREATE TABLE {schema}.ran (who text)", f"GRANT INSERT, SELECT ON {schema}.ran TO PUBLIC",
              f"CREATE FUNCTION {schema}.payload() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN "
              f"INSERT INTO {schema}.ran VALUES (current_user); RETURN {queuectl.SCHEMA_VERSION}; END $$",
              f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC", f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO PUBLIC",
              role=owner)
    return lambda: recorded(roles, f"{schema}.ran")


def wake_ups_since(listening, sender, channel):
    """How many wake-ups `listening` (a connection that LISTENs on channel) got since the last call:
    a marker is notified last, and notifications arrive in commit order, so every wake-up committed
    before it has arrived once the marker has. Nothing here waits for a notification that never comes."""
    sender.execute("SELECT pg_notify(%s, 'marker')", (channel,))
    count = 0
    for note in listening.notifies(timeout=WAIT_S):
        if note.payload == "marker":
            return count
        count += 1
    raise AssertionError("the marker notification never arrived")


def plant_operator(roles, schema, role):
    """As `role`, an operator `<>(oid, regnamespace)` in `schema` that records who ran it (in
    `schema.loot`, which every role may write): pg_catalog has no exact match for it, so an unqualified
    `oid <> regnamespace` on that search_path calls it. Returns who it recorded."""
    roles.sql(f"CREATE TABLE {schema}.loot (who text)", f"GRANT INSERT, SELECT ON {schema}.loot TO PUBLIC",
              f"CREATE FUNCTION {schema}.evil_ne(oid, regnamespace) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN "
              f"INSERT INTO {schema}.loot VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.<>) $2::oid; END $$",
              f"CREATE OPERATOR {schema}.<> (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = {schema}.evil_ne)",
              role=role)
    return lambda: recorded(roles, f"{schema}.loot")


def test_postgres_claim_from_many_threads_never_duplicates(pg_url):
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        register(s)
        s.enqueue([spec(f"j{i}") for i in range(200)], T0)
    claimed, lock, errors = [], threading.Lock(), []

    def grab():
        try:
            with contextlib.closing(queuectl.PostgresStore(pg_url, durable=False)) as mine:
                while (job := mine.claim("w1", T0)) is not None:
                    with lock:
                        claimed.append(job.id)
        except Exception as e:  # noqa: BLE001 - any failure is the bug under test
            errors.append(e)
    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(claimed) == sorted(f"j{i}" for i in range(200))
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        assert s.counts()["processing"] == 200
        assert sum(len(s.runs(f"j{i}")) for i in range(200)) == 200


def test_postgres_concurrent_first_uses_of_a_schema_do_not_race(pg_url):
    assert open_concurrently(lambda: queuectl.PostgresStore(pg_url)) == []
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        assert s.read("SELECT version FROM queuectl_version") == [(queuectl.SCHEMA_VERSION,)]


def test_postgres_schemas_are_independent_queues(pg_url):
    other_url = with_params(pg_url, schema=f"{queuectl._pg_target(pg_url)[1]}_b")
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as a, \
            contextlib.closing(queuectl.PostgresStore(other_url)) as b:
        try:
            a.enqueue([spec("same")], T0)
            b.enqueue([spec("same", command="false"), spec("only-b")], T0)  # the id is free there
            a.pause(["*"])
            register(b)
            assert [j.id for j in a.list_jobs()] == ["same"] and a.get("same").command == "true"
            assert [j.id for j in b.list_jobs()] == ["same", "only-b"]
            assert (a.paused(), b.paused()) == (["*"], [])
            assert b.claim("w1", T0).command == "false"
            assert a.claim("w1", T0) is None  # no worker registered there (and everything is paused)
            assert b.path.endswith(f"?schema={b.schema}") and a.schema != b.schema
        finally:
            b.write(lambda cur: cur.execute(f'DROP SCHEMA "{b.schema}" CASCADE'))


def test_postgres_schema_with_other_tables_or_a_newer_version_is_refused(pg_url):
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.write(lambda cur: cur.execute(f"UPDATE queuectl_version SET version = {queuectl.SCHEMA_VERSION + 1}"))
    with pytest.raises(queuectl.BadDatabase, match="newer"):
        queuectl.PostgresStore(pg_url)
    import psycopg
    foreign = f"{queuectl._pg_target(pg_url)[1]}_f"
    with psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{foreign}"')
        conn.execute(f'CREATE TABLE "{foreign}".invoices (id int)')
        try:
            code, out, err = cli(with_params(pg_url, schema=foreign), "list")
            assert code == 1 and out == ""
            assert_one_error(err, "not queuectl's", f"schema={foreign}")
        finally:
            conn.execute(f'DROP SCHEMA "{foreign}" CASCADE')


def test_postgres_a_schema_another_role_owns_is_refused_before_anything_is_written(pg_roles):
    # Bob makes a schema alice may use; what alice enqueues there would be bob's to drop and read,
    # and what he puts there her workers would run as her.
    bob, alice = pg_roles.make("bob", "LOGIN"), pg_roles.make("alice", "LOGIN")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"GRANT CREATE ON DATABASE {pg_roles.dbname} TO {bob}")
    pg_roles.sql(f"CREATE SCHEMA {schema}", f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {alice}", role=bob)
    alices = pg_roles.url(alice, schema)
    code, out, err = cli(alices, "enqueue", json.dumps({"id": "mine", "command": "true", "env": {"K": "s"}}))
    assert (code, out) == (1, "")
    assert_one_error(err, f"schema {schema} is owned by {bob}", f"not by {alice}", "?schema=")
    assert schema_tables(pg_roles, schema) == {}
    # While alice may create objects in his schema, bob is refused too: an operator she put there could
    # match queuectl's statements better than pg_catalog's and run as bob.
    code, out, err = cli(pg_roles.url(bob, schema), "enqueue", json.dumps({"id": "bobs", "command": "touch ran"}))
    assert (code, out) == (1, "")
    assert_one_error(err, f"{alice} may create objects in schema {schema}", "REVOKE CREATE")
    pg_roles.sql(f"REVOKE CREATE ON SCHEMA {schema} FROM {alice}", role=bob)
    # Bob makes the queue himself and lets alice in: her workers still will not take his jobs.
    ok(pg_roles.url(bob, schema), "enqueue", json.dumps({"id": "bobs", "command": "touch ran"}))
    pg_roles.sql(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {alice}", role=bob)
    for args in (("enqueue", '{"command": "true"}'), ("worker", "start", "--burst"),
                 ("config", "set", "max-retries", "1")):
        code, out, err = cli(alices, *args)
        assert (code, out) == (1, ""), args
        assert_one_error(err, f"schema {schema} is owned by {bob}")
    # Reading runs nothing of bob's: a command that only reads still works for alice.
    assert [j["id"] for j in json.loads(ok(alices, "list", "--json"))] == ["bobs"]
    assert json.loads(ok(alices, "show", "bobs", "--json"))["state"] == "pending"


def test_postgres_every_table_a_fresh_schema_has_is_one_whose_owner_an_open_checks(pg_url):
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        tables = s.read("SELECT tablename FROM pg_tables WHERE schemaname = %s", (s.schema,))
    assert sorted(t for (t,) in tables) == sorted(queuectl.PG_TABLES)


def test_postgres_a_table_another_role_owns_in_our_schema_is_refused(pg_roles):
    alice, bob = pg_roles.make("alice", "LOGIN"), pg_roles.make("bob", "LOGIN")
    pg_roles.sql(f"GRANT CREATE ON DATABASE {pg_roles.dbname} TO {alice}")
    schema = f"{pg_roles.prefix}_q"
    alices = pg_roles.url(alice, schema)
    enqueue(alices, id="keep", command="true")  # her own schema, made by her first use
    pg_roles.sql(f"ALTER TABLE {schema}.runs OWNER TO {bob}")
    code, out, err = cli(alices, "enqueue", '{"command": "true"}')
    assert (code, out) == (1, "")
    assert_one_error(err, f"table {schema}.runs is owned by {bob}", f"not by {alice}")
    assert [j["id"] for j in json.loads(ok(alices, "list", "--json"))] == ["keep"]


def test_postgres_roles_that_share_a_team_role_owning_the_schema_share_its_queue(pg_roles, tmp_path):
    team = pg_roles.make("team", "NOLOGIN")
    alice, bob = pg_roles.make("alice", "LOGIN", "IN ROLE", team), pg_roles.make("bob", "LOGIN", "IN ROLE", team)
    carol = pg_roles.make("carol", "LOGIN")  # may only look
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {team}")
    enqueue(pg_roles.url(alice, schema), id="a", command="touch a-ran", cwd=str(tmp_path))
    assert set(schema_tables(pg_roles, schema).values()) == {team}  # the team's, not alice's: bob may use them
    enqueue(pg_roles.url(bob, schema), id="b", command="touch b-ran", cwd=str(tmp_path))
    pool = Workers(pg_roles.url(bob, schema), tmp_path)
    try:
        worker = pool.start("--burst")
        assert worker.wait() == 0, worker.log()
    finally:
        pool.cleanup()
    assert (tmp_path / "a-ran").exists() and (tmp_path / "b-ran").exists()
    pg_roles.sql(f"GRANT USAGE ON SCHEMA {schema} TO {carol}", f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {carol}")
    carols = pg_roles.url(carol, schema)
    assert {j["id"]: j["state"] for j in json.loads(ok(carols, "list", "--json"))} == {"a": "completed", "b": "completed"}
    assert json.loads(ok(carols, "status", "--json"))["jobs"]["completed"] == 2
    code, out, err = cli(carols, "enqueue", '{"command": "true"}')
    assert (code, out) == (1, "")
    assert_one_error(err, f"schema {schema} is owned by {team}", f"not by {carol}")


def test_postgres_a_view_of_our_names_is_refused_before_it_is_read(pg_roles):
    # Bob owns the queue's schema, and turns queuectl_version into a view of a function of his: a
    # reader (carol, SELECT only), a writer who is no member of bob's (alice) and a superuser must all
    # refuse it without reading it, or bob's function runs as them, read-write.
    alice, carol = (pg_roles.make(name, "LOGIN") for name in ("alice", "carol"))
    bob, schema = bobs_queue(pg_roles)
    ran = plant_payload(pg_roles, bob, schema)
    pg_roles.sql(f"ALTER TABLE {schema}.queuectl_version RENAME TO real_version",
                 f"CREATE VIEW {schema}.queuectl_version AS SELECT {schema}.payload() AS version",
                 f"GRANT SELECT ON {schema}.queuectl_version TO PUBLIC", role=bob)
    for user, args in ((carol, ("list",)), (alice, ("enqueue", '{"command": "true"}')), (None, ("list",))):
        url = pg_roles.url(user, schema)
        code, out, err = cli(url, *args)
        assert (code, out) == (1, ""), (user, err)
        assert_one_error(err, f"{schema}.queuectl_version is a view, not a table", "not queuectl's")
    assert ran() == []
    # A view of another of our names is refused as well, whichever table it stands for.
    pg_roles.sql(f"DROP VIEW {schema}.queuectl_version", f"ALTER TABLE {schema}.real_version RENAME TO queuectl_version",
                 f"ALTER TABLE {schema}.schedules RENAME TO real_schedules",
                 f"CREATE VIEW {schema}.schedules AS SELECT * FROM {schema}.real_schedules WHERE {schema}.payload() > 0",
                 role=bob)
    code, out, err = cli(pg_roles.url(carol, schema), "schedule", "list")
    assert (code, out) == (1, "")
    assert_one_error(err, f"{schema}.schedules is a view, not a table")
    assert ran() == []


def test_postgres_a_policy_of_the_owner_never_runs_for_a_reader(pg_roles):
    # Row-level security on a table bob owns would run his policy's function as whoever reads it: the
    # session has row_security off, so carol's read fails instead, and a read without policies works.
    carol = pg_roles.make("carol", "LOGIN")
    bob, schema = bobs_queue(pg_roles)
    bobs = pg_roles.url(bob, schema)
    ran = plant_payload(pg_roles, bob, schema)
    carols = pg_roles.url(carol, schema)
    assert [j["id"] for j in json.loads(ok(carols, "list", "--json"))] == ["bobs"]
    for table in ("queuectl_version", "jobs"):
        pg_roles.sql(f"ALTER TABLE {schema}.{table} ENABLE ROW LEVEL SECURITY",
                     f"CREATE POLICY p ON {schema}.{table} USING ({schema}.payload() > 0)", role=bob)
        code, out, err = cli(carols, "list")
        assert (code, out) == (1, ""), table
        assert_one_error(err, "row-level security", f'"{table}"')
        assert ran() == []
        pg_roles.sql(f"ALTER TABLE {schema}.{table} DISABLE ROW LEVEL SECURITY", role=bob)
    # A table's owner is not subject to its policies: row_security off does not stop him.
    pg_roles.sql(f"ALTER TABLE {schema}.jobs ENABLE ROW LEVEL SECURITY", role=bob)
    assert [j["id"] for j in json.loads(ok(bobs, "list", "--json"))] == ["bobs"]
    assert ran() == []


def test_postgres_a_column_of_a_type_the_owner_made_is_refused_before_its_operators_run(pg_roles):
    # Our statements name no schema, so an operator bob puts in the queue's schema for a type of his
    # (a domain over text for jobs.state) is the one `state = ...` calls, as carol, who only reads.
    carol = pg_roles.make("carol", "LOGIN")
    bob, schema = bobs_queue(pg_roles)
    pg_roles.sql(f"CREATE DOMAIN {schema}.state AS text", f"DROP INDEX {schema}.jobs_state",
                 f"DROP TRIGGER jobs_dead ON {schema}.jobs",  # it depends on the column's type
                 f"ALTER TABLE {schema}.jobs ALTER COLUMN state TYPE {schema}.state",
                 f"CREATE FUNCTION {schema}.eq({schema}.state, {schema}.state) RETURNS bool LANGUAGE plpgsql "
                 "AS $$ BEGIN RAISE EXCEPTION 'planted operator ran as %', current_user; END $$",
                 f"CREATE OPERATOR {schema}.= (LEFTARG = {schema}.state, RIGHTARG = {schema}.state, "
                 f"FUNCTION = {schema}.eq)",
                 f"GRANT USAGE ON SCHEMA {schema} TO {carol}", f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {carol}",
                 role=bob)
    code, out, err = cli(pg_roles.url(carol, schema), "list", "--state", "pending")
    assert (code, out) == (1, "")
    assert_one_error(err, f"column state of {schema}.jobs has a type that is not PostgreSQL's own", "not queuectl's")
    assert "planted" not in err

def test_postgres_a_team_schema_whose_tables_a_member_made_before_owners_were_checked_still_migrates(pg_roles):
    # Before owners were checked, alice's first use of the team's schema made tables owned by alice; a
    # migration must run as her (who owns them), not as the team (which does not, and may not alter them).
    team = pg_roles.make("team", "NOLOGIN")
    alice = pg_roles.make("alice", "LOGIN", "IN ROLE", team)
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {team}")
    alices = pg_roles.url(alice, schema)
    enqueue(alices, id="old", command="true")
    pg_roles.sql(*(f"ALTER TABLE {schema}.{t} OWNER TO {alice}" for t in queuectl.PG_TABLES),  # as then
                 f"DROP TRIGGER jobs_dead ON {schema}.jobs", f"DROP FUNCTION {schema}.jobs_dead()",  # and one
                 f"DROP INDEX {schema}.jobs_notices",  # migration behind
                 f"ALTER TABLE {schema}.jobs DROP COLUMN on_dead, DROP COLUMN revived, DROP COLUMN notifies",
                 f"UPDATE {schema}.queuectl_version SET version = {queuectl.SCHEMA_VERSION - 1}")
    assert set(schema_tables(pg_roles, schema).values()) == {alice}
    enqueue(alices, id="new", command="true")
    with contextlib.closing(queuectl.PostgresStore(alices, reads_only=True)) as s:
        assert s.read("SELECT version FROM queuectl_version") == [(queuectl.SCHEMA_VERSION,)]
        assert [j.id for j in s.list_jobs()] == ["old", "new"]
    assert set(schema_tables(pg_roles, schema).values()) == {alice}


def test_postgres_a_schema_a_superuser_or_the_database_owner_made_is_ours(pg_roles):
    # A DBA (superuser) makes the schema and lets the app in: a superuser can rewrite anything anyway,
    # so refusing it protects nothing. The app's tables are its own (it cannot become the superuser).
    app, dbo = pg_roles.make("app", "LOGIN"), pg_roles.make("dbo", "LOGIN")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema}", f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {app}")
    enqueue(pg_roles.url(app, schema), id="a", command="true")
    assert set(schema_tables(pg_roles, schema).values()) == {app}
    # PostgreSQL 15's public belongs to pg_database_owner: the database's owner, here a superuser...
    import psycopg
    for owner in ("postgres", dbo):
        database = f"{pg_roles.prefix}_{owner.rsplit('_')[-1]}"
        pg_roles.sql(f"CREATE DATABASE {database} OWNER {owner}")
        try:
            with psycopg.connect(pg_roles.url(None, database=database), autocommit=True) as conn:
                conn.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {app}")
                public_owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace "
                                            "WHERE nspname = 'public'").fetchone()[0]
            apps = pg_roles.url(app, "public", database)
            if owner == "postgres" or public_owner != "pg_database_owner":
                enqueue(apps, id="p", command="true")
            else:  # ...or a role the app is no member of: its owner could rewrite the queue
                code, out, err = cli(apps, "enqueue", '{"command": "true"}')
                assert (code, out) == (1, "")
                assert_one_error(err, f"schema public is owned by {dbo}", f"GRANT {dbo} TO {app}")
        finally:
            pg_roles.sql(f"DROP DATABASE {database} WITH (FORCE)")


def test_postgres_tables_of_a_role_the_app_only_has_privileges_on_are_refused_until_it_is_a_member(pg_roles):
    # Least privilege: the tables belong to `owner`, the app may only use them. `owner` could rewrite
    # the queue, so the app refuses it, and says how to accept it.
    owner, app = pg_roles.make("owner", "LOGIN"), pg_roles.make("app", "LOGIN")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {owner}")
    ok(pg_roles.url(owner, schema), "enqueue", '{"id": "o", "command": "true"}')
    pg_roles.sql(f"GRANT USAGE ON SCHEMA {schema} TO {app}",
                 f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {app}",
                 f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {app}")
    apps = pg_roles.url(app, schema)
    code, out, err = cli(apps, "enqueue", '{"command": "true"}')
    assert (code, out) == (1, "")
    assert_one_error(err, f"schema {schema} is owned by {owner}", f"GRANT {owner} TO {app}", "?schema=")
    pg_roles.sql(f"GRANT {owner} TO {app}")
    enqueue(apps, id="a", command="true")

def test_postgres_schema_name_must_be_a_plain_identifier(pg_url):
    for bad in ('x"; DROP TABLE jobs; --', "a-b", "x" * 64, ""):
        code, out, err = cli(with_params(pg_url, schema=bad), "list")
        assert code == 2, (bad, err)
        assert_one_error(err, "schema")


def test_postgres_password_never_appears_in_an_error(pg_url):
    secret = "s3cr3t-Pa55"
    unreachable = free_port()
    for url, named in ((with_password(pg_url, secret, unreachable), f"127.0.0.1:{unreachable}"),
                       (with_password(with_params(pg_url, schema="q"), secret).replace("/postgres?", "/no_such_db?"),
                        "no_such_db")):
        code, out, err = cli(url, "status")
        assert code == 1 and out == ""
        assert_one_error(err, named)
        assert secret not in err
    assert_one_error(err, "cannot connect to PostgreSQL at 127.0.0.1:")
    with pytest.raises(queuectl.BadDatabase) as raised:
        queuectl.PostgresStore(with_password(pg_url, secret, unreachable))
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    with contextlib.closing(queuectl.PostgresStore(with_password(pg_url, secret))) as s:  # trust: any password
        assert secret not in s.path and secret not in repr(s)
        assert s.path == queuectl.database_name(s.target) and s.path.startswith("postgresql://postgres@127.0.0.1:")


def test_postgres_urls_that_libpq_and_we_would_read_apart_are_refused(pg_url):
    """A raw '@' in the password: libpq splits at the first '@', urlsplit at the last, and either
    error would print part of the password as a host name. A bracket, or ?schema= twice: exit 2."""
    port = free_port()
    for url, says in ((f"postgresql://pw:p@ssw0rdVerySecret@127.0.0.1:{port}/postgres", "%40"),
                      (f"postgresql://pw:Se[cretPW@127.0.0.1:{port}/postgres", "not a valid"),
                      (f"{pg_url}&schema=other", "more than once")):
        code, out, err = cli(url, "status")
        assert code == 2 and out == "", (url, err)
        assert_one_error(err, says)
        assert "ssw0rd" not in err and "Se[cret" not in err and "Traceback" not in err


def test_postgres_another_host_with_our_hostname_is_judged_by_its_lease(pg_url):
    """Our hostname and another boot id is an earlier boot of this machine only for a local file:
    on PostgreSQL it may be another machine with the same name (a cloned VM)."""
    me = queuectl.host_identity()
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.register("twin", {**me, "boot_id": "another-machine", "pid_ns": "pid:[1]"}, 1, T0)
        register(s, "me")
        s.enqueue([spec("j")], T0)
        s.claim("twin", T0)
        sweeper = queuectl.Sweeper(s, me, "me")
        assert sweeper.sweep(T0, now_mono=1000.0) == 0
        assert sweeper.sweep(T0, now_mono=1005.0) == 0 and s.get("j").state == "processing"
        assert sweeper.sweep(T0, now_mono=1011.0) == 1  # its lease ran out

def test_postgres_needs_psycopg_3_2(pg_url, monkeypatch):
    import psycopg
    monkeypatch.setattr(psycopg, "__version__", "3.1.18")
    code, out, err = cli(pg_url, "status")
    assert code == 1
    assert_one_error(err, "PostgreSQL needs psycopg 3.2 or later (found 3.1.18)")


def test_postgres_without_psycopg_says_how_to_install_it(pg_url, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now raises ImportError
    code, out, err = cli(pg_url, "status")
    assert code == 1 and out == ""
    assert_one_error(err, 'PostgreSQL needs psycopg 3: pip install "psycopg[binary]"')


def test_postgres_flush_output_never_waits_for_a_locked_run(pg_url):
    import psycopg
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        register(s)
        s.enqueue([spec("j")], T0)
        job = s.claim("w1", T0)
        with psycopg.connect(s._libpq) as other:  # a transaction that holds the run's row
            other.execute(f'SET search_path TO "{s.schema}"')
            other.execute("SELECT 1 FROM runs WHERE job_id = 'j' FOR UPDATE")
            started = time.monotonic()
            assert s.flush_output(job, b"x", 1) is False
            assert time.monotonic() - started < 1.0
        assert s.flush_output(job, b"xy", 2) is True
        assert s.run_output("j")[1:3] == (b"xy", 2)


def test_postgres_time_comes_from_the_server_clock(pg_url):
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        server = s.read("SELECT extract(epoch FROM clock_timestamp())::double precision")[0][0]
        assert abs(s.now() - server) < 1.0
        s.clock_offset_s = 3600.0  # a host whose clock runs an hour behind the server's
        assert s.now() == pytest.approx(time.time() + 3600.0, abs=1.0)


def test_postgres_a_commit_that_makes_a_job_due_notifies_the_queues_channel(pg_url):
    import psycopg
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s, \
            psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as listening, \
            psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as sender:
        channel = s.channel
        assert channel == f"queuectl_{s.schema}"
        listening.execute(f'LISTEN "{channel}"')
        register(s)
        s.enqueue([spec("later", run_at=T0 + 60)], T0)
        assert wake_ups_since(listening, sender, channel) == 1  # due later: workers sleep until then
        with pytest.raises(queuectl.Conflict):
            s.enqueue([spec("x"), spec("later")], T0)  # rolled back: nothing is sent
        assert wake_ups_since(listening, sender, channel) == 0
        s.enqueue([spec("a"), spec("b", depends_on=["a"])], T0)
        assert wake_ups_since(listening, sender, channel) == 1  # one per transaction
        s.enqueue([spec("c", depends_on=["a"])], T0)
        assert wake_ups_since(listening, sender, channel) == 0  # it waits for a
        a = s.claim("w1", T0)
        assert wake_ups_since(listening, sender, channel) == 0
        s.finish(a, "w1", outcome(), SETTINGS, T0)  # releases b and c
        assert wake_ups_since(listening, sender, channel) == 1
        b = s.claim("w1", T0)
        s.finish(b, "w1", outcome(1, "exit code 1"), SETTINGS, T0)  # a retry after its backoff
        assert wake_ups_since(listening, sender, channel) == 1
        c = s.claim("w1", T0)
        assert s.interrupt(c, "w1", LOST, True, T0) == "pending"  # recovery requeues it
        assert wake_ups_since(listening, sender, channel) == 1
        s.enqueue([spec("d", run_at=T0 + 60)], T0)
        assert wake_ups_since(listening, sender, channel) == 1
        s.cancel(["d"], T0)
        assert (s.get("d").state, wake_ups_since(listening, sender, channel)) == ("dead", 0)
        s.retry_dead(["d"], T0)
        assert wake_ups_since(listening, sender, channel) == 1
        s.pause(["*"])
        assert wake_ups_since(listening, sender, channel) == 0
        s.resume([])
        assert wake_ups_since(listening, sender, channel) == 1


def heard_by(listener, sender):
    """The payloads `listener` (a PostgresStore that LISTENs) returns from wait_notified for what was committed
    before: a marker is notified last, and notifications arrive in commit order, so the others have come
    once it has."""
    sender.write(lambda cur: cur.execute("SELECT pg_notify(%s, 'marker')", (sender.channel,)))
    heard, deadline = set(), time.monotonic() + WAIT_S
    while "marker" not in heard:
        assert time.monotonic() < deadline, "the marker notification never arrived"
        heard |= listener.wait_notified(1.0)
    return heard - {"marker"}


def test_postgres_wait_notified_tells_a_schedule_change_from_a_job_that_may_be_due(pg_url):
    """What a worker's listener hears: "" when a job may be due; SCHEDULES_CHANGED when a schedule was added,
    changed or resumed (its next slot may be sooner than the worker knows, so it looks at once); nothing for
    a pause, a removal or a resume of a running schedule, which make no slot sooner. (Re)connecting returns
    both: what was sent while it did not listen is lost."""
    changed = queuectl.SCHEDULES_CHANGED
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as listener, \
            contextlib.closing(queuectl.PostgresStore(pg_url)) as other:
        assert listener.wait_notified(0) == {"", changed}
        assert heard_by(listener, other) == set()
        add_schedule(other, now=T0, every="1h")
        assert heard_by(listener, other) == {changed}
        with pytest.raises(queuectl.Conflict):
            add_schedule(other, now=T0, every="1h")  # rolled back: nothing is sent
        assert heard_by(listener, other) == set()
        other.update_schedule(queuectl.validate_schedule({"id": "s", "every": "1m", "tz": "UTC", "command": "true"},
                                                         CONFIG_DEFAULTS_INTERNAL, "/", T0), T0)
        assert heard_by(listener, other) == {changed}
        other.pause_schedules(["s"])
        assert heard_by(listener, other) == set()
        other.resume_schedules(["s"], T0)
        assert heard_by(listener, other) == {changed}
        other.resume_schedules(["s"], T0)  # not paused: left as it is
        assert heard_by(listener, other) == set()
        other.remove_schedules(["s"])
        assert heard_by(listener, other) == set()
        other.enqueue([spec("a")], T0)
        assert heard_by(listener, other) == {""}
        assert terminate_other_sessions(pg_url) >= 2
        deadline, heard = time.monotonic() + WAIT_S, set()
        while not heard:  # the drop is seen (BadDatabase), then it connects and listens again
            assert time.monotonic() < deadline, "the listener never listened again"
            with contextlib.suppress(queuectl.BadDatabase):
                heard = listener.wait_notified(1.0)
        assert heard == {"", changed}


def test_postgres_wait_notified_sleeps_until_a_notification_and_returns_at_its_timeout_if_the_server_hangs(
        pg_url, hanging_pg):
    """The listener sleeps on its socket: a notification wakes it before its timeout (an hour here), so does a
    dropped connection, and a server that answers nothing (a hung proxy) leaves it at its timeout, not in a read
    that never ends."""
    with contextlib.closing(queuectl.PostgresStore(hanging_pg.url(pg_url))) as listener, \
            contextlib.closing(queuectl.PostgresStore(pg_url)) as other:
        listener.wait_notified(0)
        answers = []
        waiting = threading.Thread(target=lambda: answers.append(listener.wait_notified(3600.0)), daemon=True)
        waiting.start()
        other.enqueue([spec("a")], T0)
        waiting.join(WAIT_S)
        assert not waiting.is_alive() and answers == [{""}]
        hanging_pg.hang()
        other.enqueue([spec("b")], T0)  # held back by the proxy
        waiting = threading.Thread(target=lambda: answers.append(listener.wait_notified(0.2)), daemon=True)
        waiting.start()
        waiting.join(WAIT_S)
        assert not waiting.is_alive() and answers[1:] == [set()]
        hanging_pg.resume()
        assert heard_by(listener, other) == {""}  # b's, delivered once the proxy forwards again
        ended = []  # a connection dropped under it ends the wait too (the server's goodbye, the hang-up)

        def wait_an_hour():
            with contextlib.suppress(queuectl.BadDatabase):
                ended.append(listener.wait_notified(3600.0))
            ended.append("returned")
        waiting = threading.Thread(target=wait_an_hour, daemon=True)
        waiting.start()
        assert terminate_other_sessions(pg_url) >= 1
        waiting.join(WAIT_S)
        assert not waiting.is_alive() and ended[-1] == "returned"


def test_an_sqlite_commit_that_makes_a_job_due_wakes_the_workers_of_this_host_once_committed(tmp_path):
    with contextlib.closing(queuectl.SqliteStore(str(tmp_path / "q.db"))) as s, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as here:
        assert not s.notifies and not s.cut_off_kills
        worker_id = f"{os.uname().nodename}:1:test{os.getpid()}"
        s.register(worker_id, queuectl.host_identity(), 1, T0)
        register(s, "h:2:elsewhere")  # a worker of another host: never sent to
        here.bind(queuectl.wake_address(os.stat(s.path), worker_id))
        here.setblocking(False)

        def heard():
            count = 0
            with contextlib.suppress(BlockingIOError):
                while here.recv(1) == b"":
                    count += 1
            return count
        s.enqueue([spec("later", run_at=T0 + 60)], T0)
        assert heard() == 1
        with pytest.raises(queuectl.Conflict):
            s.enqueue([spec("x"), spec("later")], T0)  # rolled back: nothing is sent
        s.pause(["*"])
        assert heard() == 0
        s.resume([])
        assert heard() == 1


def test_an_sqlite_store_that_had_no_socket_for_its_wake_ups_tries_again_at_the_next_commit(tmp_path, monkeypatch):
    import _socket
    with contextlib.closing(queuectl.SqliteStore(str(tmp_path / "q.db"))) as s, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as here:
        worker_id = f"{os.uname().nodename}:1:test{os.getpid()}"
        s.register(worker_id, queuectl.host_identity(), 1, T0)
        here.bind(queuectl.wake_address(os.stat(s.path), worker_id))
        real = _socket.socket

        def no_descriptor_left(*args):
            raise OSError(24, "Too many open files")
        monkeypatch.setattr(_socket, "socket", no_descriptor_left)
        s.enqueue([spec("a")], T0)  # a moment with no descriptor left: this wake-up is lost, the job is not
        monkeypatch.setattr(_socket, "socket", real)
        s.enqueue([spec("b")], T0)
        here.settimeout(10)
        assert here.recv(1) == b""  # the next commit's wake-up is sent

def test_postgres_cli_round_trip(pg_url, monkeypatch):
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    first = enqueue(pg_url, id="a", command="echo hi", priority=2, queue="q1")
    assert (first["state"], first["priority"], first["queue"]) == ("pending", 2, "q1")
    assert ISO_UTC.match(first["created_at"]) and abs(parse_iso(first["created_at"]).timestamp() - time.time()) < 60
    enqueue(pg_url, id="b", command="true", depends_on=["a"])
    assert list_ids(pg_url) == ["a", "b"]
    assert "a" in ok(pg_url, "list") and "echo hi" in ok(pg_url, "show", "a")
    shown = get_job(pg_url, "b")
    assert (shown["state"], shown["depends_on"], shown["runs"]) == ("pending", ["a"], [])
    assert ok(pg_url, "cancel", "a") == "a\n"
    assert [get_job(pg_url, i)["state"] for i in "ab"] == ["dead", "dead"]
    assert [j["id"] for j in json.loads(ok(pg_url, "dlq", "list", "--json"))] == ["a", "b"]
    code, out, err = cli(pg_url, "dlq", "retry", "b")
    assert code == 1 and "retry both together" in err
    assert ok(pg_url, "dlq", "retry", "a", "b") == "a\nb\n"
    assert (get_job(pg_url, "b")["state"], get_job(pg_url, "b")["waiting_on"]) == ("pending", 1)
    ok(pg_url, "pause", "--queue", "q1")
    ok(pg_url, "config", "set", "max-retries", "5")
    status = json.loads(ok(pg_url, "status", "--json"))
    assert status["jobs"] == {"pending": 2, "processing": 0, "completed": 0, "failed": 0, "dead": 0}
    assert status["paused"] == ["q1"]
    monkeypatch.setenv("QUEUECTL_DB", pg_url)  # the same queue, named by the environment
    code, out, err = run_main(["status", "--json"])
    assert (code, json.loads(out)) == (0, status)
    assert run_main(["config", "get", "max-retries"])[1] == "5\n"
    code, out, err = run_main(["delete", "a"])
    assert code == 1 and "needed by" in err
    assert run_main(["delete", "a", "b"])[0] == 0
    assert run_main(["list", "--json"])[1].strip() == "[]"


def test_postgres_the_owner_check_calls_no_operator_planted_in_the_schema(pg_roles):
    """The check itself ran with the schema on search_path and an unqualified `oid <> regnamespace`, for
    which an operator evil put in the schema matched better than pg_catalog's: it ran as whoever opened
    the queue (a superuser's `status` ran it too), before the refusal."""
    evil, victim = pg_roles.make("evil", "LOGIN"), pg_roles.make("victim", "LOGIN")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"GRANT CREATE ON DATABASE {pg_roles.dbname} TO {evil}")
    pg_roles.sql(f"CREATE SCHEMA {schema}", f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC",
                 f"CREATE TABLE {schema}.jobs (x int)", role=evil)
    loot = plant_operator(pg_roles, schema, evil)
    for url in (pg_roles.url(victim, schema), with_params(pg_roles.admin, schema=schema)):
        for args in (("status",), ("add", "--", "echo hi")):
            code, _, err = cli(url, *args)
            assert code == 1, (url, args, err)
    assert loot() == []


def test_postgres_a_schema_others_may_create_in_is_refused_for_writers(pg_roles):
    """A schema a superuser made with CREATE for PUBLIC (the default of `public` up to PostgreSQL 14):
    another role could plant an operator there that queuectl's statements call as the writer."""
    victim, evil = pg_roles.make("victim", "LOGIN"), pg_roles.make("evil", "LOGIN")
    schema = f"{pg_roles.prefix}_pub"
    pg_roles.sql(f"CREATE SCHEMA {schema}", f"GRANT USAGE, CREATE ON SCHEMA {schema} TO PUBLIC")
    victims = pg_roles.url(victim, schema)
    code, out, err = cli(victims, "add", "--", "echo hi")
    assert (code, out) == (1, "")
    assert_one_error(err, f"PUBLIC may create objects in schema {schema}", f"REVOKE CREATE ON SCHEMA {schema}")
    assert schema_tables(pg_roles, schema) == {}
    pg_roles.sql(f"REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC", f"GRANT CREATE ON SCHEMA {schema} TO {victim}")
    ok(victims, "add", "--", "echo hi")  # a schema only the victim (and superusers) may create in
    assert evil  # (the role that could have planted something had the grant stayed)


def test_postgres_a_superuser_does_not_read_a_queue_another_role_owns(pg_roles):
    """A reader trusts the queue's owner (an index predicate of the owner's runs when a query is planned),
    so a superuser, whose trust would be worth the whole server, is refused; a superuser is a member of
    every role, so membership does not make another's schema its own."""
    bob, schema = bobs_queue(pg_roles)
    for args in (("list",), ("enqueue", '{"command": "true"}')):
        code, out, err = cli(with_params(pg_roles.admin, schema=schema), *args)
        assert (code, out) == (1, ""), args
        assert_one_error(err, f"schema {schema} is owned by {bob}", "not a superuser")


def test_postgres_a_function_a_stranger_left_in_the_schema_is_refused_for_writers(pg_roles):
    """A role whose CREATE on the schema was revoked (as the error asks) had already put `unnest(text[])`
    there, which the claim of `worker start --queue` called as the worker: pg_catalog has only
    unnest(anyarray), so the planted exact match won. Writers refuse a schema holding an object queuectl
    never makes, owned by a role not theirs."""
    app, mallory = pg_roles.make("app", "LOGIN"), pg_roles.make("mallory", "LOGIN")
    schema = f"{pg_roles.prefix}_m"
    pg_roles.sql(f"CREATE SCHEMA {schema}", f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {app}, {mallory}")
    pg_roles.sql(f"CREATE TABLE {schema}.ran (who text)", f"GRANT INSERT, SELECT ON {schema}.ran TO PUBLIC")
    pg_roles.sql(f"CREATE FUNCTION {schema}.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$ BEGIN "
                 f"INSERT INTO {schema}.ran VALUES (current_user); RETURN QUERY SELECT pg_catalog.unnest($1); END $$",
                 role=mallory)
    pg_roles.sql(f"REVOKE CREATE ON SCHEMA {schema} FROM {mallory}")
    apps = pg_roles.url(app, schema)
    code, out, err = cli(apps, "add", "--", "true")
    assert (code, out) == (1, "")
    assert_one_error(err, f"schema {schema} holds function unnest of {mallory}", "drop it")
    assert schema_tables(pg_roles, schema) == {"ran": "postgres"}


def test_postgres_a_member_that_does_not_inherit_is_told_before_anything_is_migrated(pg_roles):
    """A NOINHERIT member of the team that owns the schema has no USAGE on it: its first `add` created and
    committed every table (as the team) and then failed with `relation "config" does not exist`."""
    team = pg_roles.make("team")
    member = pg_roles.make("member", "LOGIN", "NOINHERIT", f"IN ROLE {team}")
    schema = f"{pg_roles.prefix}_q"
    pg_roles.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {team}")
    code, out, err = cli(pg_roles.url(member, schema), "add", "--", "true")
    assert (code, out) == (1, "")
    assert_one_error(err, f"{member} may not use schema {schema}", "USAGE")
    assert schema_tables(pg_roles, schema) == {}


# ---- PostgreSQL: a completion and the next claim in one round trip (PgPipeline) ------------------
# On PostgreSQL a completed run and the next claim go straight through libpq (PgPipeline) in one
# transaction; these pin what that path must keep, on both backends where both have the path.

def _backend_waits_for_a_lock(pg_url, backend):
    import psycopg
    with psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as admin:
        return admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                             (backend,)).fetchone()


def test_finish_and_claim_completes_releases_a_dependent_and_claims_it(store):
    """The completed path (pipelined on PostgreSQL): the run is closed, the dependent released and
    claimed in the same transaction, with its run opened."""
    register(store)
    store.enqueue([spec("a"), spec("b", depends_on=["a"])], T0)
    job = store.claim("w1", T0 + 1)
    after, following = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 2, ())
    assert (after.id, after.state, after.worker_id) == ("a", "completed", None)
    assert (following.id, following.state, following.run_count) == ("b", "processing", 1)
    assert [(r["run"], r["outcome"], r["output"]) for r in store.runs("a")] == [(1, "completed", b"ok\n")]
    assert [(r["run"], r["outcome"]) for r in store.runs("b")] == [(1, None)]
    assert store.counts()["processing"] == 1 and store.get("a").state == "completed"


def test_finish_and_claim_of_a_run_no_longer_ours_writes_nothing_for_it(store):
    register(store)
    store.enqueue([spec("a"), spec("b")], T0)
    job = store.claim("w1", T0 + 1)
    assert store.interrupt(job, "w1", LOST, True, T0 + 2) == "pending"  # as a sweeper that took it over
    lost_runs = store.runs(job.id)
    after, following = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 3, ())
    assert after is None and following is not None
    assert store.runs(job.id) == lost_runs  # the lost run's record is not overwritten by the late result
    assert store.get(job.id).state in ("pending", "processing")


def test_postgres_fast_paths_leave_the_rows_of_the_statements_they_restate(pg_url, monkeypatch):
    """PostgreSQL's fast paths restate a shared rule: a batch through COPY (SQL_COPY_JOBS, as enqueue
    and enqueue_streamed send it) leaves the jobs rows that executemany of SQL_INSERT_JOB leaves, and a
    completion through SQL_COMPLETE leaves the job, dependent and run rows of Store's path."""
    store = queuectl.PostgresStore(pg_url)
    try:
        def batch(prefix):  # enough jobs for COPY, of every shape a row can take
            return [spec(f"{prefix}{n}", command=HOSTILE_TEXT[n % len(HOSTILE_TEXT)],
                         env={"K": f"v{n}"} if n % 2 else {}, priority=n % 3, queue=f"q{n % 2}",
                         run_at=T0 + n if n % 4 == 0 else None, max_retries=n % 5, timeout=n / 10)
                    for n in range(queuectl.PG_COPY_MIN_ROWS)]

        # Every column but the key and seq (the order of insertion, which differs); the timestamps are
        # the `now` each call is given, so they are compared too.
        def rows(table, key, ids):
            found = store.read(f"SELECT {key}, to_jsonb(t) - '{key}' - 'seq' FROM {table} t WHERE {key} = ANY(%s)",
                               (list(ids),))
            return {row[0]: row[1] for row in found}

        def same(table, key, pairs):  # each pair's rows, but for the key
            mine, theirs = rows(table, key, [a for a, _ in pairs]), rows(table, key, [b for _, b in pairs])
            assert len(mine) == len(pairs) and [mine[a] for a, _ in pairs] == [theirs[b] for _, b in pairs], table

        with monkeypatch.context() as general:
            general.setattr(queuectl.PostgresStore, "_insert_rows", queuectl.Store._insert_rows)  # executemany
            store.enqueue(batch("many"), T0)
        store.enqueue(batch("copy"), T0)
        assert store.enqueue_streamed(iter(batch("stream")), T0, lambda specs: None, lambda count: None)
        numbers = range(queuectl.PG_COPY_MIN_ROWS)
        same("jobs", "id", [(f"copy{n}", f"many{n}") for n in numbers] + [(f"stream{n}", f"many{n}") for n in numbers])

        register(store)
        store.enqueue([spec("fast", priority=9), spec("fast-next", depends_on=["fast"]),
                       spec("slow", priority=9), spec("slow-next", depends_on=["slow"])], T0)
        fast, slow = store.claim("w1", T0 + 1), store.claim("w1", T0 + 1)  # by seq: the first enqueued first
        assert (fast.id, slow.id) == ("fast", "slow")
        sent = []
        pipelined = queuectl.PgPipeline.execute
        monkeypatch.setattr(queuectl.PgPipeline, "execute", lambda self, sql, *rest: sent.append(sql) or
                            pipelined(self, sql, *rest))
        outcome = queuectl.Outcome(0, None, b"out\tput\n", 0.25)
        assert store.finish_and_claim(fast, "w1", outcome, store.config_all(), T0 + 2, ("idle",))[0]
        assert store.sql.SQL_COMPLETE in sent
        assert queuectl.Store.finish_and_claim(store, slow, "w1", outcome, store.config_all(), T0 + 2, ("idle",))[0]
        same("jobs", "id", [("fast", "slow"), ("fast-next", "slow-next")])
        same("runs", "job_id", [("fast", "slow")])
        assert store.get("fast-next").next_run_at == T0 + 2  # released: both paths did something to compare
    finally:
        store.close()


def test_a_failed_statement_in_a_pipelined_result_leaves_nothing_and_the_store_works(pg_url, monkeypatch):
    store = queuectl.PostgresStore(pg_url)
    try:
        register(store)
        store.enqueue([spec("a"), spec("b")], T0)
        job = store.claim("w1", T0 + 1)
        # The statement after the completion's fails: the completion must be rolled back with it.
        broken = type("BrokenSQL", (queuectl.PostgresSQL,), {"SQL_PROMOTE": "UPDATE no_such_table SET x = %s"})
        monkeypatch.setattr(store, "sql", broken)
        with pytest.raises(queuectl.BadDatabase, match="no_such_table"):
            store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 2, ())
        monkeypatch.setattr(store, "sql", queuectl.PostgresSQL)
        assert store.get("a").state == "processing" and store.get("b").state == "pending"  # rolled back
        assert store.conn.info.transaction_status == store.psycopg.pq.TransactionStatus.IDLE
        after, following = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 3, ())
        assert after.state == "completed" and following.id == "b"
    finally:
        store.close()


def test_a_pipelined_completion_notifies_only_when_it_releases_a_dependent(pg_url):
    import psycopg
    store = queuectl.PostgresStore(pg_url)
    listener = psycopg.connect(pg_url.split("?")[0], autocommit=True)
    try:
        listener.execute(f'LISTEN "{store.channel}"')
        register(store)
        store.enqueue([spec("a"), spec("b", depends_on=["a"]), spec("c")], T0)
        drained = list(listener.notifies(timeout=0.5, stop_after=1))  # the enqueue's own wake-up
        assert drained
        job = store.claim("w1", T0 + 1)
        assert job.id == "a"
        after, following = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 2, ())
        assert list(listener.notifies(timeout=2, stop_after=1)), "releasing b must wake the workers"
        after, following = store.finish_and_claim(following, "w1", DONE, store.config_all(), T0 + 3, ())
        assert after.state == "completed" and following is not None
        assert not list(listener.notifies(timeout=0.5, stop_after=1)), "nothing was released: no wake-up"
    finally:
        listener.close()
        store.close()


def test_the_claim_after_each_completion_takes_the_best_job_by_priority(store):
    register(store)
    store.enqueue([spec("a", priority=9), spec("low"), spec("high", priority=5), spec("mid", priority=2)], T0)
    job, taken = store.claim("w1", T0 + 1), []
    while job is not None:
        after, job = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 2, ())
        assert (after.state, after.worker_id) == ("completed", None)
        taken.append(job and (job.id, job.state, job.worker_id))
    assert taken == [("high", "processing", "w1"), ("mid", "processing", "w1"), ("low", "processing", "w1"), None]
    for job_id in ("a", "high", "mid", "low"):  # each run opened by its claim and closed by its completion
        assert [(r["run"], r["worker_id"], r["outcome"], r["output"]) for r in store.runs(job_id)] == \
            [(1, "w1", "completed", b"ok\n")]


def test_a_late_result_of_a_job_another_worker_took_writes_nothing_and_releases_nothing(store):
    register(store, "w1")
    register(store, "w2")
    store.enqueue([spec("a"), spec("d", depends_on=["a"])], T0)
    mine = store.claim("w1", T0 + 1)
    assert store.interrupt(mine, "w1", LOST, True, T0 + 2) == "pending"  # as a sweeper that took it back
    theirs = store.claim("w2", T0 + 3)
    assert (theirs.id, theirs.run_count) == ("a", 2)
    runs = store.runs("a")
    after, following = store.finish_and_claim(mine, "w1", DONE, store.config_all(), T0 + 4, ())
    assert after is None and following is None  # d still waits for a
    assert store.runs("a") == runs  # neither the lost run's record nor w2's run is touched
    a, d = store.get("a"), store.get("d")
    assert (a.state, a.worker_id, a.run_count, a.exit_code) == ("processing", "w2", 2, None)
    assert (d.state, d.waiting_on) == ("pending", 1)


def test_postgres_a_completion_on_a_dropped_connection_fails_then_reconnects_and_records_it_once(pg_url):
    import psycopg
    store = queuectl.PostgresStore(pg_url, durable=False)
    try:
        register(store)
        store.enqueue([spec("a"), spec("b")], T0)
        settings, job = store.config_all(), store.claim("w1", T0 + 1)
        backend = store.conn.info.backend_pid
        assert terminate_other_sessions(pg_url) >= 1
        with psycopg.connect(queuectl._pg_target(pg_url)[0], autocommit=True) as admin:
            wait_for(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                               (backend,)).fetchone(), "the worker's backend to end")
        with pytest.raises(queuectl.BadDatabase):  # as Runner._record meets it, and then tries again
            store.finish_and_claim(job, "w1", DONE, settings, T0 + 2, ())
        after, following = store.finish_and_claim(job, "w1", DONE, settings, T0 + 3, ())
        assert store.conn.info.backend_pid != backend  # a new connection, its statements prepared again
        assert after.state == "completed" and (following.id, following.run_count) == ("b", 1)
        assert [(r["run"], r["outcome"]) for r in store.runs("a")] == [(1, "completed")]
        assert [(r["run"], r["outcome"]) for r in store.runs("b")] == [(1, None)]
        after, following = store.finish_and_claim(following, "w1", DONE, settings, T0 + 4, ())
        assert after.state == "completed" and following is None
    finally:
        store.close()


def test_postgres_a_worker_whose_connections_drop_between_jobs_runs_each_once_and_records_each(pg_url, tmp_path):
    pool = Workers(pg_url, tmp_path)
    try:
        enqueue(pg_url, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
        enqueue(pg_url, id="next", command="echo ran >> next.log", cwd=str(tmp_path))
        pool.start()  # one runner: `next` is claimed with long's result, on the dropped connection
        wait_for(lambda: (tmp_path / "started").exists(), "the long job to start")
        assert terminate_other_sessions(pg_url) >= 3
        (tmp_path / "release").touch()
        wait_for(lambda: get_job(pg_url, "next")["state"] == "completed", "the next job to complete")
        assert [(r["outcome"], r["output"]) for r in get_job(pg_url, "long")["runs"]] == [("completed", "finished\n")]
        assert [r["outcome"] for r in get_job(pg_url, "next")["runs"]] == ["completed"]
        assert (tmp_path / "next.log").read_text() == "ran\n"
    finally:
        pool.cleanup()


def test_pg_prepared_numbers_the_marks_of_a_statement_for_libpq():
    name, text, marks = queuectl.pg_prepared("SELECT %s, %s")
    assert (text, marks) == (b"SELECT $1, $2", ("", ""))
    name2, text, marks = queuectl.pg_prepared("SELECT %(b)s, %(a)s, %(b)s")
    assert (text, marks) == (b"SELECT $1, $2, $1", ("b", "a"))
    assert name != name2 and name.startswith(b"queuectl_")


def test_postgres_a_failed_claim_after_a_committed_completion_leaves_the_claim_to_the_runner(pg_url, monkeypatch):
    """The best job is in a limited queue: the completion commits first, then a claim of its own takes
    the queue's lock. If that claim fails, the result must not be written again (it would be found no
    longer ours and reported as discarded): the runner's next claim takes the job."""
    store = queuectl.PostgresStore(pg_url)
    try:
        register(store)
        store.set_limit("lim", 1)
        store.enqueue([spec("a", priority=9), spec("l1", queue="lim")], T0)
        job = store.claim("w1", T0 + 1)

        def unreachable(*args):
            raise queuectl.BadDatabase("database: server closed the connection")
        monkeypatch.setattr(store, "claim", unreachable)
        after, following = store.finish_and_claim(job, "w1", DONE, store.config_all(), T0 + 2, ())
        assert after.state == "completed" and following is None
        assert store.get("a").state == "completed" and store.get("l1").state == "pending"
        monkeypatch.undo()
        assert store.claim("w1", T0 + 3).id == "l1"
    finally:
        store.close()


@contextlib.contextmanager
def _result_behind_an_enqueue_of_its_dependent(pg_url, a, result):
    """Claim job `a`; while an enqueue of `d`, which depends on a, holds a's lock (it reads a's state FOR
    UPDATE), make a's result (`result(store, job, settings)`) wait for that lock, then let the enqueue
    commit. Yields (the store, the result's answer)."""
    import threading
    store, other = queuectl.PostgresStore(pg_url), queuectl.PostgresStore(pg_url)
    inserted, go, results = threading.Event(), threading.Event(), []
    try:
        register(store)
        store.enqueue([a], T0)
        job, settings = store.claim("w1", T0 + 1), store.config_all()

        def enqueue_d(cur):
            other._insert_with_deps(cur, spec("d", depends_on=["a"]), T0 + 2)
            inserted.set()
            go.wait(WAIT_S)
        enqueuing = threading.Thread(target=lambda: other.write(enqueue_d))
        enqueuing.start()
        assert inserted.wait(WAIT_S)
        resulting = threading.Thread(target=lambda: results.append(result(store, job, settings)))
        resulting.start()
        wait_for(lambda: _backend_waits_for_a_lock(pg_url, store.conn.info.backend_pid),
                 "the result to wait for a's lock")
        go.set()
        enqueuing.join(WAIT_S)
        resulting.join(WAIT_S)
        yield store, results[0]
    finally:
        go.set()
        store.close()
        other.close()


def test_postgres_a_completion_that_waited_for_an_enqueue_of_its_dependent_releases_that_dependent(pg_url):
    """The worker's fast path (finish_and_claim) must see d's dependency once the enqueue committed (a
    statement that began before that commit reads deps as of its start), else d waits for `a` forever."""
    with _result_behind_an_enqueue_of_its_dependent(
            pg_url, spec("a"), lambda store, job, settings: store.finish_and_claim(
                job, "w1", DONE, settings, T0 + 3, ())) as (store, (after, following)):
        assert after.state == "completed"
        assert store.get("d").waiting_on == 0  # released: a completed after d's enqueue committed
        assert following is not None and following.id == "d" or store.claim("w1", T0 + 4).id == "d"


@pytest.mark.parametrize("code, state", [(0, "completed"), (1, "dead")])
def test_postgres_a_result_that_waited_for_an_enqueue_of_its_dependent_sees_to_that_dependent(pg_url, code, state):
    """Store's path for a result (finish(): a completion outside the worker's fast path, or a death): the
    read that decides whether the run has dependents to release or kill (SQL_RUN_TIES) must come after the
    job's lock, so a dependent whose enqueue held that lock and committed meanwhile is seen, not left
    waiting forever, nor alive below a dead job."""
    with _result_behind_an_enqueue_of_its_dependent(
            pg_url, spec("a", max_retries=0), lambda store, job, settings: store.finish(
                job, "w1", outcome(code, "boom" if code else None), settings, T0 + 3)) as (store, finished):
        assert finished.state == state
        d = store.get("d")
        if state == "completed":
            assert (d.state, d.waiting_on) == ("pending", 0) and store.claim("w1", T0 + 4).id == "d"
        else:
            assert (d.state, d.last_error) == ("dead", "dependency a is dead")


def test_postgres_a_completion_that_fails_before_its_first_statement_is_sent_returns_and_leaves_no_pipeline(
        pg_url, monkeypatch):
    """On a new connection the first statement is prepared (sent) before its parameters are: if these
    cannot be sent, the prepare's answer never comes without a sync, so waiting for it would hang."""
    import threading
    store = queuectl.PostgresStore(pg_url)
    try:
        register(store)
        store.enqueue([spec("a"), spec("b")], T0)
        job, settings = store.claim("w1", T0 + 1), store.config_all()
        dump = queuectl.PgPipeline._dump

        def unsendable(self, value):
            if value == "a":
                raise UnicodeEncodeError("utf-8", value, 0, 1, "as a parameter that cannot be encoded")
            return dump(self, value)
        monkeypatch.setattr(queuectl.PgPipeline, "_dump", unsendable)
        raised = []
        completing = threading.Thread(target=lambda: raised.append(pytest.raises(
            UnicodeEncodeError, store.finish_and_claim, job, "w1", DONE, settings, T0 + 2, ())), daemon=True)
        completing.start()
        completing.join(WAIT_S)
        assert not completing.is_alive() and raised  # raised, not hung waiting for an answer
        monkeypatch.undo()
        after, following = store.finish_and_claim(job, "w1", DONE, settings, T0 + 3, ())
        assert after.state == "completed" and following.id == "b"
    finally:
        store.close()


def test_postgres_a_completion_with_a_big_output_on_a_descriptor_above_1023_is_recorded(pg_url):
    """A worker with many runners may hold its connection on a descriptor above 1023, which select()
    refuses: a completion whose output does not go out in one write must neither fail nor hang there."""
    import resource
    import threading
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("needs more than 1,200 open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    store, held = queuectl.PostgresStore(pg_url), []
    try:
        register(store)
        store.enqueue([spec("a"), spec("b")], T0)
        job, settings = store.claim("w1", T0 + 1), store.config_all()
        store.conn.close()  # reopened at its next use, above every descriptor held here
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        output, results = os.urandom(8 << 20), []  # more than a socket takes at once
        completing = threading.Thread(target=lambda: results.append(store.finish_and_claim(
            job, "w1", queuectl.Outcome(0, None, output, 0.1), settings, T0 + 2, ())), daemon=True)
        completing.start()
        completing.join(WAIT_S)
        assert store.conn.pgconn.socket > 1023 and not completing.is_alive()
        after, following = results[0]
        assert after.state == "completed" and following.id == "b"
        assert store.runs("a")[0]["output"] == output
    finally:
        for fd in held:
            os.close(fd)
        store.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ==== Process identity and control ================================================================

def test_process_identity_of_self_and_of_a_gone_process():
    me = queuectl.host_identity()
    assert me["proc_start"] == queuectl.proc_start_time(os.getpid())
    assert not queuectl.process_gone(os.getpid(), me["proc_start"])
    assert queuectl.process_gone(os.getpid(), "1")  # same PID, other start time: recycled
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert queuectl.process_gone(proc.pid, "whatever")


def test_kill_run_finds_processes_by_token():
    env = {**os.environ, "QUEUECTL_RUN": "w/1/job"}
    proc = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], env={**os.environ, "QUEUECTL_RUN": "w/1/job2"})
    try:
        assert list(queuectl.kill_run("w/1/job").killed) == [proc.pid]
        assert proc.wait(timeout=10) == -9
        assert other.poll() is None  # a different run's process is left alone
    finally:
        other.kill()
        other.wait()


def test_kill_run_takes_the_runs_session_even_without_the_token(tmp_path):
    # A process whose environment cannot be read as ours (mid-exec, or cleared with env -i) but that
    # lives in the session of a process carrying the token is one of the run's, and is killed too.
    pidfile = tmp_path / "pid"
    script = f"env -i /bin/sleep 30 & echo $! > {pidfile}; wait"  # the shell keeps the token, never exec'ing
    env = {**os.environ, "QUEUECTL_RUN": "w/1/sess"}
    bystander = subprocess.Popen(["env", "-i", "sleep", "30"])  # our session, no token: left alone
    leader = subprocess.Popen(["/bin/sh", "-c", script], env=env, start_new_session=True)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the run's child to start")
        child = int(pidfile.read_text())
        left = queuectl.kill_run("w/1/sess")
        assert len(left.killed) == 2
        assert leader.wait(timeout=10) == -9
        assert queuectl.wait_gone(left, 10)  # the child too (or a zombie waiting for init)
        assert bystander.poll() is None
    finally:
        for proc in (leader, bystander):
            proc.kill()
            proc.wait()


def test_kill_never_signals_a_process_whose_start_time_changed():
    """A PID recycled between the scan and the kill is left alone (checked through a pidfd)."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        assert queuectl._kill(bystander.pid, "not-its-start-time") is None
        assert bystander.poll() is None
        assert queuectl._kill(bystander.pid, queuectl.proc_start_time(bystander.pid)) is None
        assert bystander.wait(timeout=10) == -signal.SIGKILL
    finally:
        bystander.kill()
        bystander.wait()


def test_kill_run_names_a_leftover_it_may_not_kill_and_does_not_raise(monkeypatch):
    token = f"w/1/perm-{uuid.uuid4().hex}"
    leftover = subprocess.Popen(["sleep", "60"], env={**os.environ, "QUEUECTL_RUN": token})
    real_kill = queuectl._kill
    monkeypatch.setattr(queuectl, "_kill", lambda pid, start: "permission denied" if pid == leftover.pid
                        else real_kill(pid, start))
    try:
        wait_for(lambda: token.encode() in open(f"/proc/{leftover.pid}/environ", "rb").read(), "the exec")
        left = queuectl.kill_run(token)
        assert left.stuck == f"cannot kill leftover process {leftover.pid} (sleep): permission denied"
        assert not left.gone() and leftover.poll() is None
    finally:
        leftover.kill()
        leftover.wait()
    wait_for(left.gone, "the leftover to be gone")  # gone, though nobody may read its environment


def test_a_run_cut_short_with_a_leftover_it_may_not_kill_is_never_retried(tmp_path, monkeypatch):
    """A timed-out run whose child (a setuid program, say) left the process group and may neither be
    read nor signalled by the worker: found through the run's session, named, and the job goes dead
    instead of being retried (a retry could overlap it)."""
    pidfile = tmp_path / "pid"
    def is_leftover(pid):
        return pidfile.exists() and pidfile.read_text().strip() == str(pid)
    real_kill, real_environ = queuectl._kill, queuectl._environ
    monkeypatch.setattr(queuectl, "_kill", lambda pid, start: "permission denied" if is_leftover(pid)
                        else real_kill(pid, start))
    monkeypatch.setattr(queuectl, "_environ", lambda pid: None if is_leftover(pid) else real_environ(pid))
    child = f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); time.sleep(30)'"
    try:
        result = run(f"{child} & echo $! > {pidfile}; wait", timeout=1)
        pid = int(pidfile.read_text())
        name = queuectl._read(f"/proc/{pid}/comm")
        assert result.stuck == f"cannot kill leftover process {pid} ({name}): permission denied"
        assert queuectl.failure_rule(make_job(max_retries=5), result, SETTINGS, T0)[0] == "dead"
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_process_whose_main_thread_exited_is_alive_while_its_other_threads_run(tmp_path):
    code = ("import ctypes, threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
            "ctypes.CDLL(None).pthread_exit(None)")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "QUEUECTL_RUN": "w/1/mt"})
    try:
        wait_for(lambda: queuectl._stat_fields(proc.pid)[0] == "Z", "the main thread to exit")
        assert queuectl.proc_start_time(proc.pid) is not None  # it still holds its memory, files, locks
        assert b"QUEUECTL_RUN=w/1/mt\0" in queuectl._environ(proc.pid)
        left = queuectl.kill_run("w/1/mt")
        assert list(left.killed) == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_from_an_earlier_boot_of_this_host_is_dead_at_once(sqlite_store):
    """Only for a local file: on PostgreSQL our hostname with another boot id may be another machine
    (see test_postgres_another_host_with_our_hostname_is_judged_by_its_lease)."""
    store = sqlite_store
    me = queuectl.host_identity()
    if not me["boot_id"]:
        pytest.skip("no /proc/sys/kernel/random/boot_id on this system: only the lease applies")
    store.register("old-boot", {**me, "boot_id": "a-previous-boot"}, 1, T0)
    store.register("me", me, 1, T0)
    store.enqueue([spec("left")], T0)
    store.claim("old-boot", T0)
    assert queuectl.Sweeper(store, me, "me").sweep(T0 + 1, now_mono=0.0) == 1
    assert store.get("left").state == "pending"


def test_a_recycled_pid_is_never_signalled(store, tmp_path):
    """A worker row whose PID now belongs to an unrelated process: the sweeper declares the worker
    dead (the start time differs) and recovers its job, but the unrelated process lives on."""
    me = queuectl.host_identity()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        store.register("ghost", {**me, "pid": bystander.pid, "proc_start": "1"}, 1, T0)
        store.register("me", me, 1, T0)
        store.enqueue([spec("orphan")], T0)
        store.claim("ghost", T0)
        assert queuectl.Sweeper(store, me, "me").sweep(T0 + 1) == 1
        assert store.get("orphan").state == "pending"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_the_end_of_a_run_is_not_taken_for_the_end_of_a_later_run_with_its_pid():
    """`-PID TOKEN` dropped whatever run held that PID: if the PID was reused by another runner's job
    before the end of the first was sent, the watchdog forgot the second and would leave it running."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"+TA\n4242 TA\n+TB\n4242 TB\n-4242 TA\n")
    os.close(write_end)
    told, starting = queuectl._watch(read_end)
    os.close(read_end)
    assert [token for _, token in told.values()] == [b"TB"] and starting == set()


# ---- the PostgreSQL watchdog: one process per worker kills its runs when the worker dies ---------
# Jobs on PostgreSQL start as on SQLite (posix_spawn, no preexec_fn); a process forked by the worker at
# its start kills every process of the worker's runs once the worker is gone, SIGKILL included.

def watchdog_of(worker_pid):
    """The PID of a worker's watchdog (its child named qctl-watchdog), or None."""
    return next((pid for pid in _children(worker_pid) if queuectl._read(f"/proc/{pid}/comm") == "qctl-watchdog"),
                None)


def _fd_targets(pid):
    folder = f"/proc/{pid}/fd"
    return {os.readlink(f"{folder}/{fd}") for fd in os.listdir(folder)}


def _watchdogs(tag):
    """The live watchdog processes among the processes carrying a test's tag."""
    return [pid for pid in tagged_pids(tag) if queuectl._read(f"/proc/{pid}/comm") == "qctl-watchdog"]


def full_pipe():
    """A pipe whose write end is non-blocking and full, as a stalled watchdog leaves the worker's: (read
    end, write end, the bytes of filler in it)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write_end, False)
    filler = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            filler += os.write(write_end, b"\n" * 512)
    return read_end, write_end, filler


def read_exactly(fd, size):
    """Read `size` bytes from `fd` (the filler full_pipe wrote)."""
    data = b""
    while len(data) < size:
        data += os.read(fd, size - len(data))
    return data


def test_without_a_watchdog_a_job_that_must_die_with_its_worker_gets_the_preexec_fn(tmp_path, monkeypatch):
    """The fallback when a PostgreSQL worker's watchdog is gone: the parent-death signal set by a
    preexec_fn before the exec (the job's first process only); other jobs are spawned without one."""
    import subprocess as sp
    seen = []
    real = sp.Popen

    def spy(args, **kw):
        seen.append((list(args), kw.get("preexec_fn")))
        return real(args, **kw)
    monkeypatch.setattr(sp, "Popen", spy)
    monkeypatch.setattr(queuectl.Watchdog, "current", None)
    job = queuectl.Job.from_row(("j", "/bin/echo hi", "processing", 0, 0, 0.0, str(tmp_path), "{}", T0, T0, T0, None,
                                 None, "w1", 1, 0, 0, "default", 0))
    out = queuectl.run_command(job, {}, lambda: None, die_with_worker=True)
    assert (out.exit_code, out.output) == (0, b"hi\n")
    assert seen[-1][0] == ["/bin/echo", "hi"] and seen[-1][1] is not None
    queuectl.run_command(job, {}, lambda: None, die_with_worker=False)
    assert seen[-1][0] == ["/bin/echo", "hi"] and seen[-1][1] is None


def test_a_sigkilled_postgres_worker_takes_every_process_of_its_runs_with_it(pg_url, pg_workers, tmp_path):
    """The worker's whole process group gets SIGKILL mid-job; its watchdog, in a session of its own,
    is spared and kills: a job's shell and its background child, one that cleared its environment (in
    the run's session), one that left the session (by its token), and a job whose first process has no
    token at all (env -i, found only as the session the worker told of). The parent-death signal of
    before took the first processes only; nothing else here can kill the others (no other worker)."""
    shell = ("sleep 60 & echo $! > bg; env -i /bin/sleep 61 & echo $! > bare; setsid sleep 62 & echo $! > away; "
             "echo $$ > shell; wait")
    enqueue(pg_url, id="shell", command=shell, cwd=str(tmp_path))
    enqueue(pg_url, id="bare", command="env -i /bin/sleep 63", cwd=str(tmp_path))
    worker = pg_workers.start("--count", "2")
    names = ["bg", "bare", "away", "shell"]
    wait_for(lambda: all((tmp_path / name).is_file() and (tmp_path / name).read_text().endswith("\n")
                         for name in names), "the shell job's processes")
    watchdog = wait_for(lambda: watchdog_of(worker.popen.pid), "the watchdog")

    def both_jobs():
        found = [pid for pid in _children(worker.popen.pid) if pid != watchdog]
        return found if len(found) == 2 else None
    leaders = wait_for(both_jobs, "both jobs to start")  # their first processes (one has no token at all)
    pids = [int((tmp_path / name).read_text()) for name in names] + leaders
    assert len(set(pids)) == 5 and not any(pid_gone(pid) for pid in pids)
    os.killpg(worker.popen.pid, signal.SIGKILL)  # the worker leads its group (start_new_session)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: all(pid_gone(pid) for pid in pids), "every process of the runs to die with the worker", timeout=10)
    wait_for(lambda: pid_gone(watchdog), "the watchdog to exit once done", timeout=10)


def test_a_postgres_job_starts_by_posix_spawn_and_the_watchdog_is_told_of_it(pg_url, monkeypatch):
    used, told = [], []
    real_spawn, real_tell = queuectl._posix_spawn, queuectl.Watchdog.tell
    monkeypatch.setattr(queuectl, "_posix_spawn", lambda *a: used.append(a[0]) or real_spawn(*a))
    monkeypatch.setattr(queuectl.Watchdog, "tell",
                        lambda self, pid, token: told.append(pid) or real_tell(self, pid, token))
    with InProcessWorker(pg_url, monkeypatch) as worker, contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.enqueue([spec("a", cwd=os.getcwd())], s.now())
        wait_for(lambda: s.get("a").state == "completed", "the job to run", timeout=20)
        watchdog = worker.worker.watchdog.pid
        assert watchdog in _children(os.getpid()) and not pid_gone(watchdog)
        assert queuectl.Watchdog.current is worker.worker.watchdog
        assert queuectl.watchdog_at_work(worker.worker.worker_id)  # what sweepers on this host wait for
    assert len(used) == 1 and len(told) == 1
    assert queuectl.Watchdog.current is None and not queuectl.watchdog_at_work(worker.worker.worker_id)
    with pytest.raises(ChildProcessError):  # stopped with the worker, and reaped
        os.waitpid(watchdog, os.WNOHANG)


def test_a_postgres_worker_that_exits_cleanly_leaves_no_watchdog_and_it_killed_nothing(pg_url, pg_workers, tmp_path):
    enqueue(pg_url, id="j", command="sleep 60 & echo $! > bg", cwd=str(tmp_path))
    worker = pg_workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    bg = int((tmp_path / "bg").read_text())
    assert tagged_pids(pg_workers.tag) == [bg]  # no watchdog left, and the job's child lives on, as on SQLite


def test_a_worker_whose_watchdog_was_killed_warns_once_and_falls_back_to_the_parent_death_signal(
        pg_url, pg_workers, tmp_path):
    worker = pg_workers.start()
    worker.wait_log("worker started")
    watchdog = wait_for(lambda: watchdog_of(worker.popen.pid), "the watchdog")
    os.kill(watchdog, signal.SIGKILL)
    worker.wait_log("the watchdog process is gone")
    assert watchdog not in _children(worker.popen.pid)  # reaped: no zombie
    enqueue(pg_url, id="j", command="sleep 60", cwd=str(tmp_path))
    [first] = wait_for(lambda: job_leaders(pg_workers.tag, worker.popen.pid), "the job to start")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: pid_gone(first), "the job's first process to die with its worker", timeout=10)
    assert worker.log().count("watchdog process is gone") == 1


@pytest.mark.parametrize("folder", ["the worker's (posix_spawn)", "another (Popen)"])
def test_no_job_inherits_the_watchdog_pipe(pg_url, pg_workers, tmp_path, folder):
    enqueue(pg_url, id="j", command="sleep 60", cwd=os.getcwd() if "posix" in folder else str(tmp_path))
    worker = pg_workers.start()
    [job] = wait_for(lambda: job_leaders(pg_workers.tag, worker.popen.pid), "the job to start")
    [pipe] = [target for target in _fd_targets(watchdog_of(worker.popen.pid)) if target.startswith("pipe:")]
    assert pipe in _fd_targets(worker.popen.pid)  # the worker holds the write end
    assert pipe not in _fd_targets(job)


def test_a_finished_jobs_background_child_outlives_a_later_crash_of_its_worker(db, workers, tmp_path):
    """README: "When the shell exits, the run is over. A background child (`cmd &`) that is still
    running is neither waited for nor killed." A worker that crashes later, its job long completed,
    has no run to protect from a rerun: the child lives on, on both backends."""
    enqueue(db, id="j", command="sleep 60 & echo $! > bg", cwd=str(tmp_path))
    worker = workers.start()
    wait_for(lambda: state_of(db, "j") == "completed", "the job to complete")
    bg = int((tmp_path / "bg").read_text())
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: not _watchdogs(workers.tag), "the watchdog (PostgreSQL) to be done", timeout=10)
    assert not pid_gone(bg)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_every_queuectl_process_leaves_the_watchdog_to_guard_the_worker(pg_url, pg_workers, tmp_path,
                                                                                     sig):
    """`pkill -f queuectl` (or -INT, -HUP) reaches the watchdog too: it is a fork of the worker, with its
    command line. Each asks the worker to stop gracefully, and its running job goes on. The watchdog must
    still be there to kill the job when the worker dies (here: a SIGKILL during the graceful stop), or a
    rerun on another host overlaps it."""
    enqueue(pg_url, id="j", command="sleep 60 & echo $! > bg; wait", cwd=str(tmp_path))
    worker = pg_workers.start()
    wait_for(lambda: (tmp_path / "bg").is_file() and (tmp_path / "bg").read_text().endswith("\n"), "the job")
    watchdog = wait_for(lambda: watchdog_of(worker.popen.pid), "the watchdog")
    [shell] = job_leaders(pg_workers.tag, worker.popen.pid)
    bg = int((tmp_path / "bg").read_text())
    for pid in (worker.popen.pid, watchdog):  # what pkill -f does, one process after the other
        os.kill(pid, sig)
    worker.wait_log("stopping (")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: pid_gone(shell) and pid_gone(bg), "the job's processes to die with their worker", timeout=10)


def test_a_frozen_watchdog_does_not_keep_its_dead_workers_jobs_from_a_worker_on_the_same_host(
        pg_url, pg_workers, tmp_path):
    """A same-host sweeper waits for a dead worker's watchdog to free its name. A watchdog that never
    does (stopped: SIGSTOP, a debugger, a frozen cgroup of its own) must not hold the worker's jobs for
    ever: a worker on another host reruns them once the lease has run out, and so must one here."""
    ok(pg_url, "config", "set", "stale-timeout", "2")
    enqueue(pg_url, id="j", command="sleep 60", cwd=str(tmp_path))
    first = pg_workers.start()
    wait_for(lambda: state_of(pg_url, "j") == "processing", "the job to start")
    watchdog = wait_for(lambda: watchdog_of(first.popen.pid), "the watchdog")
    os.kill(watchdog, signal.SIGSTOP)
    try:
        first.signal(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        pg_workers.start()
        wait_for(lambda: get_job(pg_url, "j")["lost_count"] == 1, "the job to be recovered", timeout=20)
    finally:
        os.kill(watchdog, signal.SIGKILL)
        os.kill(watchdog, signal.SIGCONT)


def test_the_watchdog_never_takes_a_recycled_pid_for_a_run_it_was_told_of(tmp_path):
    """The watchdog reads each told PID's start time when it reads the message, up to 20 ms (or, if it
    was starved or stopped, much) later. By then the job may have ended, been reaped, and its PID been
    given to another process (pid_max is 32,768 on many hosts): one that leads a session of its own is
    an ordinary sight (another worker's job, a login shell). Told of such a PID, a watchdog whose worker
    is alive must not take it for a run: here the test process is the worker, and tells of a stranger."""
    started = subprocess.run(["setsid", "-f", "sh", "-c", f"echo $$ > {tmp_path}/pid; exec sleep 60"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert started.returncode == 0
    stranger = int(wait_for(lambda: (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text().strip(),
                            "the stranger"))
    try:
        assert queuectl._session(stranger) == stranger and stranger not in _children(os.getpid())
        watchdog = queuectl.Watchdog.start(f"watchdog-test:{os.getpid()}:{os.urandom(3).hex()}")
        assert watchdog is not None
        watchdog.tell(stranger, b"watchdog-test/1/stranger")
        watchdog.stop(clean=False)  # as if the worker had died: it reads the message, then EOF, then kills
        assert not pid_gone(stranger)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stranger, signal.SIGKILL)


@pytest.mark.parametrize("where", ["posix_spawn", "popen"])
@pytest.mark.parametrize("command", ["sleep 60", "sh -c 'sleep 60; true'"])
def test_a_job_whose_worker_dies_before_telling_its_watchdog_still_dies_with_it(tmp_path, where, command):
    """The worker tells its watchdog of a run before the run's first process exists: a worker killed
    between the start and the message (a few milliseconds on a loaded host, time enough for a
    `kill -9` or the OOM killer) left a job the watchdog never heard of running until the next sweep."""
    token = f"watchdog-test/1/{uuid.uuid4().hex}"
    cwd = str(tmp_path) if where == "posix_spawn" else "/"  # the worker's own folder: posix_spawn, else Popen
    dying = subprocess.run([sys.executable, "-c", _DIES_AFTER_SPAWN, HERE, cwd, command, token], cwd=tmp_path,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT_S)
    assert dying.returncode == -signal.SIGKILL, dying.stderr
    first = int(dying.stdout)
    try:
        wait_for(lambda: pid_gone(first), "the job's first process to die with its worker", timeout=5)
    finally:
        queuectl.kill_run(token)  # what the watchdog left, if it missed the run


def test_pkill_9_f_of_the_worker_command_line_leaves_the_watchdog_to_kill_its_jobs(pg_url, pg_workers, tmp_path):
    """`pkill -9 -f 'queuectl.*worker start'` is how many stop a worker that will not stop. The watchdog is a
    fork of the worker: with the worker's command line it was killed together with it, and nothing killed
    the jobs (the parent-death signal is no longer set while a watchdog lives), so a rerun elsewhere
    overlapped them. The pattern here is the worker's --db URL, which no job's command line holds."""
    enqueue(pg_url, id="j", command="sleep 60 & echo $! > bg; wait", cwd=str(tmp_path))
    worker = pg_workers.start()
    wait_for(lambda: (tmp_path / "bg").is_file() and (tmp_path / "bg").read_text().endswith("\n"), "the job")
    wait_for(lambda: watchdog_of(worker.popen.pid), "the watchdog")
    [shell] = job_leaders(pg_workers.tag, worker.popen.pid)
    bg = int((tmp_path / "bg").read_text())
    for pid in tagged_pids(pg_workers.tag):  # what pkill -9 -f does
        if pg_url in (queuectl._read(f"/proc/{pid}/cmdline") or ""):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: pid_gone(shell) and pid_gone(bg), "the job's processes to die with their worker", timeout=10)


def test_a_run_whose_shell_dies_of_its_workers_death_is_still_killed_by_the_watchdog(pg_url, pg_workers,
                                                                                       tmp_path):
    """The worker never saw the run end: it is `processing`, and reruns elsewhere after stale-timeout.
    Its shell, printing, dies of SIGPIPE the moment the worker dies and is reaped by the orphans' reaper
    before the watchdog looks (here: the watchdog is held stopped meanwhile, as a starved one is). Its
    background child, same session and same token, must still be killed: the run was never over."""
    enqueue(pg_url, id="j", command="sleep 60 & echo $! > bg; while :; do echo tick; sleep 0.05; done",
            cwd=str(tmp_path))
    log_path, pid_file = tmp_path / "reaped-worker.stderr", tmp_path / "worker.pid"
    with open(log_path, "wb") as err:
        popen = subprocess.Popen([sys.executable, "-c", _REAPER, str(pid_file), QUEUECTL, "--db", pg_url,
                                  "worker", "start"], stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                 start_new_session=True, env=child_env(**{TAG_VAR: pg_workers.tag}))
    pg_workers.procs.append(WorkerProc(popen, log_path))
    worker = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), "the worker"))
    wait_for(lambda: (tmp_path / "bg").is_file() and (tmp_path / "bg").read_text().endswith("\n"), "the job")
    bg = int((tmp_path / "bg").read_text())
    [shell] = [pid for pid in job_leaders(pg_workers.tag, worker) if pid != popen.pid]  # not the reaper
    watchdog = wait_for(lambda: watchdog_of(worker), "the watchdog")
    os.kill(watchdog, signal.SIGSTOP)
    try:
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{shell}"), "the shell to die of SIGPIPE and be reaped")
        assert state_of(pg_url, "j") == "processing"
    finally:
        os.kill(watchdog, signal.SIGCONT)
    wait_for(lambda: not _watchdogs(pg_workers.tag), "the watchdog to be done", timeout=10)
    assert pid_gone(bg), "the background child of a run still in progress outlived the worker and its watchdog"


def test_watchdog_messages_that_find_the_pipe_full_wait_and_go_in_order():
    """A stalled watchdog's full pipe dropped messages: with `+TOKEN` through and the run's end lost, the
    watchdog killed the background child of a run that had finished. Now they wait, in order."""
    read_end, write_end, filler = full_pipe()
    watchdog = queuectl.Watchdog(None, write_end)
    watchdog.starting(b"w/1/a")
    watchdog.tell(4242, b"w/1/a")
    watchdog.ended(4242, b"w/1/a")
    assert len(watchdog.backlog) == 3
    read_exactly(read_end, filler)  # the watchdog reads again: room in the pipe
    watchdog.check()  # the housekeeping tick sends what waited
    assert watchdog.backlog == []
    os.close(write_end)
    rest = b""
    while chunk := os.read(read_end, 65536):
        rest += chunk
    os.close(read_end)
    assert rest == b"+w/1/a\n4242 w/1/a\n-4242 w/1/a\n"


def test_a_watchdog_stopped_uncleanly_first_sends_what_waits():
    """stop(clean=False) closed the pipe with the backlog unsent: the end of a finished run was lost, and
    the watchdog, reading EOF, killed that run's background children."""
    read_end, write_end, filler = full_pipe()
    watchdog = queuectl.Watchdog(None, write_end)
    watchdog.tell(4242, b"w/1/a")
    watchdog.ended(4242, b"w/1/a")
    read_exactly(read_end, filler)
    watchdog.stop(clean=False)
    rest = b""
    while chunk := os.read(read_end, 65536):
        rest += chunk
    os.close(read_end)
    assert rest == b"4242 w/1/a\n-4242 w/1/a\n"


# ==== Execution ===================================================================================

# ---- running a command ---------------------------------------------------------------------------

def test_timeout_also_kills_children_that_left_the_group(tmp_path):
    marker = tmp_path / "escaped.pid"
    out = run(f"setsid sleep 300 & echo $! > {marker}; wait", timeout=0.5)
    assert "timed out" in out.error
    wait_for(lambda: marker.exists() and marker.read_text().strip(), "the setsid child's pid")
    escaped = int(marker.read_text())
    wait_for(lambda: queuectl.proc_start_time(escaped) is None, "the setsid child to be killed")


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


@pytest.mark.parametrize("command", ["env", "sleep 0", "false", "true", "ls /no/such/path", "cat /proc/self/stat",
                                     "sh -c exit\\ 3", "nosuchprogram-qc", "env -u PATH printenv PATH"])
def test_plain_commands_behave_exactly_as_under_sh(command, tmp_path):
    """The direct-exec fast path must be invisible: same exit code and output as `sh -c`."""
    queuectl._ENV.clear()  # the worker's environment is snapshot at its first job; take it now
    folder = tmp_path / "real"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(folder)
    for cwd in (str(folder), str(link)):
        job = make_job(command=command, cwd=cwd, env={"EXTRA": "1"})
        ours = queuectl.run_command(job, {"QUEUECTL_RUN": "t/1/x"}, lambda: None)
        env = {**os.environ, "EXTRA": "1", "QUEUECTL_RUN": "t/1/x"}
        shell = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env=env, capture_output=True)
        expected_code = shell.returncode if shell.returncode >= 0 else 128 - shell.returncode
        assert ours.exit_code == expected_code, (command, cwd)
        if command.startswith("cat /proc/self/stat"):
            continue  # a different process each time; only that it ran the same way matters
        assert sorted(ours.output.splitlines()) == sorted((shell.stdout + shell.stderr).splitlines()), (command, cwd)


def test_without_path_the_shell_decides(tmp_path):
    fake = tmp_path / "ls"
    fake.write_text("#!/bin/sh\necho local-ls\n")
    fake.chmod(0o755)
    assert queuectl.direct_argv("ls -d /", str(tmp_path), {b"HOME": b"/"}) is None


def test_only_plain_words_skip_the_shell():
    env = {k.encode(): v.encode() for k, v in os.environ.items()}
    assert queuectl.direct_argv("sleep 1", "/", env)[1] == ["sleep", "1"]
    for command in ("echo hi", "FOO=1 env", "ls *", "a | b", "cd /tmp", "true --help", "x=1", "ls ~",
                    "echo $HOME", "ls 'a b'", "nosuchprogram-qc", "sleep 1; true", "exit 3", "ls\nls"):
        assert queuectl.direct_argv(command, "/", env) is None, command


def test_a_plain_jobs_pwd_is_dashs_and_the_same_name_costs_no_stat(tmp_path, monkeypatch):
    """$PWD of a job started without sh: the inherited name where it names the job's folder (a link
    to it too), else the real path; the job's folder under the inherited name is taken without a stat."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    link = str(tmp_path / "link").encode()
    assert queuectl._shell_pwd(str(real), link) == link
    assert queuectl._shell_pwd(str(real), str(tmp_path).encode()) == str(real).encode()
    assert queuectl._shell_pwd(str(tmp_path / "link"), b"relative") == str(real).encode()
    monkeypatch.setattr(os, "stat", lambda *a, **k: pytest.fail("a stat for the folder's own name"))
    assert queuectl._shell_pwd(str(real), str(real).encode()) == str(real).encode()


def test_run_command_finds_plain_programs_with_a_non_utf8_path(tmp_path, monkeypatch):
    """The worker's environment is bytes: a PATH folder that is not UTF-8 must not break a plain job."""
    path = b"/opt/caf\xe9:" + os.environb[b"PATH"]
    assert queuectl.direct_argv("true", "/", {b"PATH": path})[1] == ["true"]
    monkeypatch.setattr(queuectl, "_ENV", {**os.environb, b"PATH": path})
    result = run("echo plain")
    assert (result.exit_code, result.error, result.output) == (0, None, b"plain\n")


def test_plain_jobs_run_with_a_non_utf8_byte_in_the_workers_path(db, tmp_path):
    enqueue(db, id="p", command="true")
    env = {**{k.encode(): v.encode() for k, v in child_env().items()}, b"PATH": b"/opt/caf\xe9:" + os.environb[b"PATH"]}
    result = subprocess.run([sys.executable, QUEUECTL, "--db", db, "worker", "start", "--burst"], env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT_S)
    assert result.returncode == 0, result.stderr
    job = get_job(db, "p")
    assert (job["state"], job["last_error"]) == ("completed", None)


def test_no_shell_sees_ids_cwd_or_env_values(db, workers, tmp_path):
    odd = tmp_path / "dir with $(touch pwned); and spaces"
    odd.mkdir()
    job_id = "$(touch pwned)"
    payload = json.dumps({"id": job_id, "command": 'printf "%s|%s" "$QUEUECTL_JOB_ID" "$EVIL"; pwd',
                          "cwd": str(odd), "env": {"EVIL": "`touch pwned`"}})
    ok(db, "enqueue", payload)
    assert workers.start("--burst").wait() == 0
    for folder in (tmp_path, odd, os.getcwd()):
        assert not os.path.exists(os.path.join(folder, "pwned")), folder
    out = ok(db, "logs", job_id)
    assert out == f"{job_id}|`touch pwned`{odd}\n"


def test_a_job_that_exits_after_the_quick_phase_while_a_child_holds_its_output_ends_at_its_exit(tmp_path):
    """The exit of a job running past QUICK_JOB_S is watched through a pidfd: a background child that
    keeps the output pipe open must not hold the run until the child ends."""
    marker = tmp_path / "child"
    out = run(f"sleep 0.1; (sleep 30; touch {marker}) & echo started")
    assert (out.exit_code, out.output) == (0, b"started\n")
    assert out.duration_s < 20  # the run ended with the shell, not with the 30 s child
    assert not marker.exists()


# ---- jobs started with os.posix_spawn and glibc's posix_spawn ------------------------------------
# A job whose folder is the worker's own is started with posix_spawn instead of Popen (through glibc's,
# called with ctypes, where glibc is there); it must not be told apart from one Popen started.

def _run_here(command, env=None):
    job = make_job(command=command, cwd=os.getcwd(), env=env or {})
    return queuectl.run_command(job, {"QUEUECTL_RUN": "t/1/x"}, lambda: None)


@pytest.mark.parametrize("command", SPAWN_COMMANDS)
def test_posix_spawn_runs_a_job_as_popen_does(command, monkeypatch):
    queuectl._ENV.clear()
    spawned = _run_here(command, {"EXTRA": "1"})
    monkeypatch.setattr(queuectl, "_in_current_folder", lambda cwd: False)  # the Popen path
    popened = _run_here(command, {"EXTRA": "1"})
    assert (spawned.exit_code, spawned.error) == (popened.exit_code, popened.error)
    if "/proc/$$/stat" in command:
        pgrp, session, pid = spawned.output.split()
        assert pgrp == session == pid  # its own session and process group, as start_new_session gives
    else:
        assert sorted(spawned.output.splitlines()) == sorted(popened.output.splitlines())


def test_posix_spawn_is_used_only_without_chdir_and_parent_death_signal(monkeypatch, tmp_path):
    queuectl._ENV.clear()
    used = []
    real = queuectl._posix_spawn
    monkeypatch.setattr(queuectl, "_posix_spawn", lambda *a: used.append(a[0]) or real(*a))
    assert _run_here("true").exit_code == 0 and _run_here("true; true").exit_code == 0
    assert len(used) == 2 and used[1] == b"/bin/sh"
    job = make_job(command="pwd", cwd=str(tmp_path))
    assert queuectl.run_command(job, {"QUEUECTL_RUN": "t/1/y"}, lambda: None).output == f"{tmp_path}\n".encode()
    here = make_job(command="true", cwd=os.getcwd())
    assert queuectl.run_command(here, {"QUEUECTL_RUN": "t/1/z"}, lambda: None, die_with_worker=True).exit_code == 0
    assert len(used) == 2


def test_posix_spawn_does_not_pass_inherited_descriptors(tmp_path):
    """Popen closes every descriptor above 2 in the job; a descriptor the worker inherited (not
    close-on-exec) must not reach a job started with posix_spawn either."""
    queuectl._ENV.clear()
    fd = os.open(str(tmp_path / "inherited"), os.O_WRONLY | os.O_CREAT)
    high = os.dup2(fd, 77)  # inheritable
    try:
        queuectl._no_inherited_fds.cache_clear()  # the worker does this at its first job
        for command in ("ls /proc/self/fd", "ls /proc/$$/fd"):
            out = _run_here(command)
            assert out.exit_code == 0 and b"77" not in out.output.split(), out.output
    finally:
        os.close(fd)
        os.close(high)


def test_posix_spawn_timeout_kills_the_group(tmp_path):
    marker = tmp_path / "child.pid"
    job = make_job(command=f"sleep 30 & echo $! > {marker}; wait", cwd=os.getcwd(), timeout=0.5)
    out = queuectl.run_command(job, {"QUEUECTL_RUN": "t/2/x"}, lambda: None)
    assert out.exit_code is None and "timed out" in out.error
    child = int(marker.read_text())
    wait_for(lambda: queuectl.proc_start_time(child) is None, "the timed-out job's child to die")


@needs_glibc
@pytest.mark.parametrize("command", SPAWN_COMMANDS)
def test_glibc_spawn_runs_a_job_as_os_posix_spawn_does(command, monkeypatch):
    queuectl._ENV.clear()
    used = []
    real = queuectl._glibc_spawn()
    monkeypatch.setattr(queuectl, "_glibc_spawn", lambda: lambda *a: used.append(a[0]) or real(*a))
    through_ctypes = _run_here(command, {"EXTRA": "1"})
    assert used
    monkeypatch.setattr(queuectl, "_glibc_spawn", lambda: None)
    through_os = _run_here(command, {"EXTRA": "1"})
    assert (through_ctypes.exit_code, through_ctypes.error) == (through_os.exit_code, through_os.error)
    if "/proc/$$/stat" in command:
        pgrp, session, pid = through_ctypes.output.split()
        assert pgrp == session == pid
    else:
        assert sorted(through_ctypes.output.splitlines()) == sorted(through_os.output.splitlines())


@needs_glibc
def test_glibc_spawn_reports_a_failed_exec_as_os_posix_spawn_does(tmp_path):
    script = tmp_path / "noexec"
    script.write_text("echo hi\n")
    for program, error in ((b"/no/such/program", FileNotFoundError), (os.fsencode(script), PermissionError)):
        read_end, write_end = os.pipe()
        try:
            with pytest.raises(error) as raised:
                queuectl._glibc_spawn()(program, ["x"], {b"PATH": b"/bin"}, write_end)
            with pytest.raises(error) as expected:
                queuectl._os_spawn(program, ["x"], {b"PATH": b"/bin"}, write_end)
            assert (raised.value.errno, raised.value.filename) == (expected.value.errno, expected.value.filename)
        finally:
            os.close(read_end)
            os.close(write_end)


@needs_glibc
@pytest.mark.parametrize("argv, env", [(["tr\0ue"], {b"PATH": b"/bin"}), (["true"], {b"A=B": b"1"}),
                                       (["true"], {b"A": b"1\0"})], ids=["nul-arg", "equals-name", "nul-value"])
def test_glibc_spawn_refuses_what_os_posix_spawn_refuses(argv, env):
    """A C string ends at NUL and a name with '=' would change another variable: both are refused
    with os.posix_spawn's own error, never passed on cut short."""
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(ValueError) as raised:
            queuectl._glibc_spawn()(b"/bin/true", argv, env, write_end)
        with pytest.raises(ValueError) as expected:
            queuectl._os_spawn(b"/bin/true", argv, env, write_end)
        assert str(raised.value) == str(expected.value)
    finally:
        os.close(read_end)
        os.close(write_end)


@needs_glibc
def test_glibc_spawn_gives_a_job_variable_that_the_worker_also_has_once_with_the_jobs_value(monkeypatch):
    """The worker's environment array is built once without the names a job sets: an overridden
    variable appears once, with the job's value, and a change of the worker's environment is seen."""
    queuectl._ENV.clear()
    monkeypatch.setattr(queuectl, "_ENV", {**os.environb, b"QC_SHARED": b"worker", b"QC_ONLY_WORKER": b"1"})
    out = _run_here("env", {"QC_SHARED": "job"})
    lines = out.output.decode().splitlines()
    assert [line for line in lines if line.startswith("QC_SHARED=")] == ["QC_SHARED=job"]
    assert "QC_ONLY_WORKER=1" in lines
    monkeypatch.setattr(queuectl, "_ENV", {**os.environb, b"QC_ONLY_WORKER": b"2"})
    lines = _run_here("env").output.decode().splitlines()
    assert "QC_ONLY_WORKER=2" in lines and not any(line.startswith("QC_SHARED=") for line in lines)


# ---- output-limit: the tail of each run's output that is kept ------------------------------------

def test_run_command_keeps_the_tail_it_is_asked_to_keep():
    job = make_job(command="seq 1 3000", timeout=0.0, cwd="/", env={})
    out = queuectl.run_command(job, {"QUEUECTL_RUN": f"test/{os.getpid()}/{time.monotonic()}"}, lambda: None,
                               keep_bytes=1024)
    full = "".join(f"{i}\n" for i in range(1, 3001)).encode()
    assert (out.output, out.output_bytes) == (full[-1024:], len(full))


@sqlite_only
def test_output_limit_takes_sizes_and_refuses_others(db):
    for value, stored in (("1024", 1024), ("64K", 65536), ("512KiB", 524288), ("1M", 1048576), ("64MiB", 67108864)):
        ok(db, "config", "set", "output-limit", value)
        assert ok(db, "config", "get", "output_limit") == f"{stored}\n"
    before = snapshot(db)
    for value, fragment in (("1023", "1024 (1 KiB)"), ("67108865", "64 MiB"), ("65M", "64 MiB"),
                            ("1.5K", "not a size"), ("64KB", "not a size"), ("-1", "not a size")):
        code, _, err = cli(db, "config", "set", "output-limit", value)
        assert code == 2, (value, err)
        assert_one_error(err, "output-limit", fragment)
    assert snapshot(db) == before


def test_a_run_that_printed_more_than_the_limit_keeps_the_exact_tail_and_says_so(db, workers):
    ok(db, "config", "set", "output-limit", "1K")
    enqueue(db, id="big", command="seq 1 20000")
    enqueue(db, id="small", command="echo small")
    assert workers.start("--burst").wait() == 0
    full = "".join(f"{i}\n" for i in range(1, 20001))
    code, out, err = cli(db, "logs", "big")
    assert (code, out) == (0, full[-1024:])  # stdout: exactly the kept bytes
    assert err == f"queuectl: note: run 1 printed {queuectl.size_text(len(full))}; this is its last 1 KiB " \
                  "(config output-limit)\n" and queuectl.size_text(len(full)) == "106.3 KiB"
    run = get_job(db, "big")["runs"][-1]
    assert (run["output_bytes"], run["output_kept_bytes"], run["output"]) == (len(full), 1024, full[-1024:])
    shown = ok(db, "show", "big")
    assert "\noutput: last 1 KiB of 106.3 KiB\n" + full[-1024:] in shown
    assert cli(db, "logs", "small") == (0, "small\n", "")  # within the limit: no note
    assert "\noutput:\nsmall\n" in ok(db, "show", "small")
    assert get_job(db, "small")["runs"][-1]["output_kept_bytes"] == 6


def test_the_limit_applies_to_runs_that_start_after_it_is_set(db, workers):
    enqueue(db, id="before", command="seq 1 20000")
    assert workers.start("--burst").wait() == 0
    ok(db, "config", "set", "output-limit", "2K")
    enqueue(db, id="after", command="seq 1 20000")
    assert workers.start("--burst").wait() == 0
    assert get_job(db, "before")["runs"][-1]["output_kept_bytes"] == 65536  # the default: 64 KiB
    assert get_job(db, "after")["runs"][-1]["output_kept_bytes"] == 2048


def test_logs_follow_notes_a_gap_on_stderr_and_writes_only_job_bytes_to_stdout(capsys):
    assert queuectl._print_new(b"0123456789", 30, 0) == 30
    out, err = capsys.readouterr()
    assert out == "0123456789"
    assert err == "queuectl: note: 20 B of output not kept here (config output-limit)\n"


# ---- the kill grace ------------------------------------------------------------------------------

def run_graced(command, grace_s, timeout=0.0, abort=lambda: None):
    job = make_job(command=command, timeout=timeout, cwd="/")
    return queuectl.run_command(job, {"QUEUECTL_RUN": f"test/{os.getpid()}/{time.monotonic()}"}, abort,
                                kill_grace=lambda: grace_s)


def test_kill_grace_config(db):
    assert ok(db, "config", "get", "kill-grace") == "10\n"
    ok(db, "config", "set", "kill-grace", "0")
    assert ok(db, "config", "get", "kill_grace") == "0\n"
    for bad in ("-1", "3601", "x"):
        code, _, err = cli(db, "config", "set", "kill-grace", bad)
        assert code == 2 and "kill-grace" in err, err
    assert ok(db, "config", "get", "kill-grace") == "0\n"


def test_a_timeout_sends_sigterm_first_and_a_trap_can_clean_up(tmp_path):
    marker = tmp_path / "cleaned"
    # timeouts of 2 s here: the shell must have set its trap before SIGTERM comes, also on a loaded machine
    out = run_graced(f"trap 'echo cleaning; touch {marker}; exit 3' TERM; sleep 30 & wait", 30, timeout=2)
    assert out.error == "timed out after 2s (terminated)"
    assert marker.exists() and b"cleaning" in out.output


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    out = run_graced(f"trap '' TERM; echo $$ > {pid_file}; sleep 30", 1, timeout=2)
    assert out.error == "timed out after 2s (killed after 1s grace)"
    assert time.monotonic() - started >= 3  # the grace was waited for, then SIGKILL
    wait_for(lambda: pid_gone(int(pid_file.read_text())), "the job's shell to be gone")


def test_after_the_grace_a_process_that_left_the_group_is_still_killed(tmp_path):
    pid_file = tmp_path / "pid"
    command = (f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & "
               f"while [ ! -s {pid_file} ]; do sleep 0.05; done; trap 'exit 0' TERM; sleep 30 & wait")
    out = run_graced(command, 30, timeout=1)
    assert out.error == "timed out after 1s (terminated)"
    wait_for(lambda: pid_gone(int(pid_file.read_text())), "the process in a session of its own to be killed")


def test_no_grace_kills_at_once_and_a_hard_abort_cuts_the_grace_short(tmp_path):
    assert run_graced("trap '' TERM; sleep 30", 0, timeout=0.3).error == "timed out after 0.3s"
    trapped, stop_at = tmp_path / "trapped", []

    def abort():  # canceled once the trap is set, then a hard stop a second later
        if not trapped.exists():
            return None
        stop_at.append(stop_at[0] if stop_at else time.monotonic() + 1.0)
        return "canceled" if time.monotonic() < stop_at[0] else "worker hard stop"
    out = run_graced(f"trap '' TERM; touch {trapped}; sleep 30", 600, abort=abort)
    assert out.error == "canceled (killed: worker hard stop)" and out.interrupted == "canceled"


def test_the_grace_leaves_the_jobs_first_process_unreaped_for_end_run(tmp_path, monkeypatch):
    # end_run finds what is left of the run's session by the session id, the first process's PID: safe
    # only while that process is not reaped (a reaped PID may be given to a new session's leader).
    at_end_run, end_run = [], queuectl.end_run

    def recording_end_run(proc, token):
        at_end_run.append(proc.returncode)
        return end_run(proc, token)
    monkeypatch.setattr(queuectl, "end_run", recording_end_run)
    out = run_graced("trap 'exit 3' TERM; sleep 30 & wait", 30, timeout=1)
    assert out.error == "timed out after 1s (terminated)" and at_end_run == [None]


def test_a_stopped_job_is_continued_so_that_sigterm_reaches_it(tmp_path):
    # A stopped process (SIGSTOP, a debugger) acts on SIGTERM only once continued: without a SIGCONT
    # it would sit out the whole grace and be killed without the chance to clean up.
    marker = tmp_path / "cleaned"
    out = run_graced(f"trap 'touch {marker}; exit 3' TERM; kill -STOP $$; sleep 30", 8, timeout=1)
    assert out.error == "timed out after 1s (terminated)" and marker.exists()


def test_the_grace_works_without_waitid(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "waitid")  # as where Python has none: the leader is watched with poll()
    out = run_graced("trap 'exit 3' TERM; sleep 30 & wait", 30, timeout=1)
    assert out.error == "timed out after 1s (terminated)"
    assert run_graced("trap '' TERM; sleep 30", 1, timeout=1).error == "timed out after 1s (killed after 1s grace)"


# ==== Workers =====================================================================================

# ---- runners and the sweeper: claims, leases, recovery -------------------------------------------

def test_backoff_grows_caps_and_logs_a_failing_loop_sparingly(caplog, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(queuectl.time, "monotonic", lambda: clock[0])
    backoff = queuectl.Backoff("claim", 5.0)
    with caplog.at_level("WARNING", logger="queuectl"):
        waits = [backoff.failed(OSError("disk full")) for _ in range(12)]
        clock[0] += 30
        backoff.failed(OSError("disk full"))
        backoff.ok()
    assert waits[0] == 0.1 and waits == sorted(waits) and waits[-1] == 5.0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages  # the first failure, one 30 s later, and the recovery
    assert "13 failure(s)" in messages[1] and "works again" in messages[2]


def test_worker_run_once_with_injected_runner(store):
    register(store)
    store.enqueue([spec("a")], T0)
    worker = queuectl.Runner(store, "w1", lambda job_id, registration: None)
    seen = {}

    def fake_runner(job, env, abort, on_output):
        seen.update(env)
        return outcome(1, "exit code 1", "boom")
    worker.execute = fake_runner
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
    store.register("remote", {**me, "host": "elsewhere", "boot_id": "other-boot"}, 1, T0)
    store.register("me", me, 1, T0)
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


def test_a_worker_back_under_its_id_keeps_the_job_it_claims_after_the_drop(store):
    me = {"host": "elsewhere", "pid": 1, "proc_start": "1", "boot_id": "b", "pid_ns": "ns"}
    store.register("w", me, 1, T0)
    store.enqueue([spec("old"), spec("new")], T0)
    store.register("x", {**me, "host": "sweeper"}, 1, T0)
    old = store.claim("w", T0)
    held = store.drop_worker("w", 0, T0, "x")
    assert held == [("old", 1, "w")]  # adopted by x, with the worker its run was started by
    store.register("w", me, 1, T0 + 1)  # it comes back under the same id and claims again
    fresh = store.claim("w", T0 + 1)
    lost = queuectl.Outcome(None, "worker lost", None, None, interrupted="worker lost")
    assert store.interrupt(old, "w", lost, True, T0 + 2) is None  # no longer w's: x recovers it
    assert store.interrupt(old, "x", lost, True, T0 + 2) == "pending"
    assert store.get(fresh.id).state == "processing"


def test_sweeper_requeues_jobs_of_unregistered_owner(store):
    register(store, "gone")
    store.enqueue([spec("a")], T0)
    store.claim("gone", T0)
    store.write(lambda cur: cur.execute("DELETE FROM workers"))
    register(store, "me")
    assert queuectl.Sweeper(store, queuectl.host_identity(), "me").sweep(T0) == 1
    assert store.get("a").state == "pending"



def test_recovery_of_a_lost_run_is_decided_once_and_waits_for_its_processes(store, monkeypatch):
    """Two sweepers see one lost worker: the first adopts its job and holds it until the run's
    processes are gone (by PID and start time); the second, whose scan finds nothing (a killed
    process's environment reads empty at once), leaves it alone instead of requeueing it."""
    me = queuectl.host_identity()
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.register("dead", {**me, "pid": dead.pid, "proc_start": "1"}, 1, T0)
    store.register("a", me, 1, T0)
    store.register("b", me, 1, T0)
    store.enqueue([spec("j")], T0)
    store.claim("dead", T0)
    tearing_down = [True]  # the killed run still holds its files and locks
    monkeypatch.setattr(queuectl.Leftovers, "gone", lambda self: not tearing_down[0])
    a = queuectl.Sweeper(store, me, "a")
    b = queuectl.Sweeper(store, me, "b")
    assert a.sweep(T0 + 1) == 0
    assert (store.get("j").state, store.get("j").worker_id) == ("processing", "a")
    assert b.sweep(T0 + 1) == 0 and b.recovering == {}
    assert store.get("j").state == "processing"
    tearing_down[0] = False
    assert b.sweep(T0 + 2) == 0
    assert a.sweep(T0 + 2) == 1
    job = store.get("j")
    assert (job.state, job.lost_count, job.worker_id) == ("pending", 1, None)
    assert store.runs("j")[0]["outcome"] == "lost"


def test_swept_jobs_tells_orphans_adopted_runs_and_own_runs_apart(store):
    """A sweep's one read: the orphans (processing, their worker not registered), the runs the sweeping worker
    adopted and has not requeued (another worker started them), and its own runs; a processing job of another
    registered worker is none of these, whoever sweeps."""
    for worker_id in ("me", "other", "gone", "lost"):
        register(store, worker_id)
    store.enqueue([spec(job_id, queue=job_id) for job_id in ("orphan", "adopted", "own", "others")], T0)
    for worker_id, job_id in (("gone", "orphan"), ("lost", "adopted"), ("me", "own"), ("other", "others")):
        assert store.claim(worker_id, T0, (job_id,)).id == job_id
    store.deregister("gone")
    store.deregister("lost")
    assert store.adopt("adopted", 1, "lost", "me") == "lost"

    def swept(worker_id):
        return tuple(sorted(rows) for rows in store.swept_jobs(worker_id))
    assert swept("me") == ([("orphan", 1, "gone")], [("adopted", 1, "lost")], [("own", 1)])
    assert swept("other") == ([("orphan", 1, "gone")], [], [("others", 1)])
    store.deregister("other")  # its job is an orphan now
    assert swept("me") == ([("orphan", 1, "gone"), ("others", 1, "other")], [("adopted", 1, "lost")], [("own", 1)])
    register(store, "other")  # registered again before anyone adopted it: its own run again, no orphan
    assert swept("me") == ([("orphan", 1, "gone")], [("adopted", 1, "lost")], [("own", 1)])
    assert swept("other") == ([("orphan", 1, "gone")], [], [("others", 1)])


def test_an_adopting_sweeper_that_dies_leaves_the_run_to_the_next(store, monkeypatch):
    """The adopter dies before requeueing: its adopted job is an orphan, and the next sweeper kills
    the run by the token of the worker that started it."""
    me = queuectl.host_identity()
    store.register("w", {**me, "host": "elsewhere", "boot_id": "b"}, 1, T0)
    store.register("c", me, 1, T0)
    store.enqueue([spec("j")], T0)
    store.claim("w", T0)
    store.drop_worker("w", 0, T0, "c")  # c adopted it, then died (its row is gone)
    store.write(lambda cur: cur.execute("DELETE FROM workers WHERE id = 'c'"))
    register(store, "d")
    tokens = []
    monkeypatch.setattr(queuectl, "kill_run", lambda token, left: tokens.append(token) or left)
    assert queuectl.Sweeper(store, me, "d").sweep(T0 + 1) == 1
    assert tokens == ["w/1/j"] and store.get("j").state == "pending"


def test_a_leftover_that_cannot_be_killed_sends_its_job_dead_once(store, monkeypatch, caplog):
    me = queuectl.host_identity()
    store.register("gone", {**me, "pid": 2**22 + 7, "proc_start": "1"}, 1, T0)
    store.register("me", me, 1, T0)
    store.enqueue([spec("stuck"), spec("fine")], T0)
    store.claim("gone", T0)
    stuck = "cannot kill leftover process 4242 (sleep): permission denied"

    def kill_run(token, left):
        left.stuck = stuck if token.endswith("/stuck") else None
        return left
    monkeypatch.setattr(queuectl, "kill_run", kill_run)
    sweeper = queuectl.Sweeper(store, me, "me")
    with caplog.at_level("WARNING", logger="queuectl"):
        assert sweeper.sweep(T0 + 1) == 1
        assert sweeper.sweep(T0 + 2) == 0
    job = store.get("stuck")
    assert (job.state, job.last_error) == ("dead", stuck)
    assert store.get("fine").state == "pending"
    assert [r.getMessage() for r in caplog.records if stuck in r.getMessage()] == [
        f"job stuck recovered from lost worker -> dead ({stuck})"]


def test_a_lowered_stale_timeout_does_not_shorten_the_lease_of_a_silent_worker(store):
    """stale-timeout lowered while a remote worker cannot beat (a server that hangs for it alone): that
    worker still kills its runs at half the value it read with its last beat, which it cannot re-read now.
    So a sweeper holds it to the longest value in force since it last saw that beat move (the value of its
    sweep before too: the worker may have read it just before the change), and reruns nothing earlier."""
    me = queuectl.host_identity()
    store.register("remote", {**me, "host": "elsewhere", "boot_id": "other-boot"}, 1, T0)
    register(store, "me")
    store.enqueue([spec("a")], T0)
    store.claim("remote", T0)
    store.config_set("stale_timeout", 60)
    sweeper = queuectl.Sweeper(store, me, "me")
    assert sweeper.sweep(T0, now_mono=1000.0) == 0
    store.heartbeat("remote", T0)  # its last beat: it reads 60 with it, then its server hangs
    store.config_set("stale_timeout", 4)
    assert sweeper.sweep(T0, now_mono=1001.0) == 0  # the beat seen moving, after the change
    assert sweeper.sweep(T0, now_mono=1010.0) == 0  # 9 s: it kills its run only at 30 s
    assert sweeper.sweep(T0, now_mono=1060.0) == 0
    assert store.get("a").state == "processing"
    assert sweeper.sweep(T0, now_mono=1061.5) == 1
    # A worker that beat once the change was in force read it: the lower value holds it from then on.
    store.register("remote2", {**me, "host": "elsewhere2", "boot_id": "other-boot"}, 1, T0)
    store.enqueue([spec("b")], T0)
    store.claim("remote2", T0)
    assert sweeper.sweep(T0, now_mono=1070.0) == 0
    assert sweeper.sweep(T0, now_mono=1075.0) == 1


def test_a_lowered_stale_timeout_spares_a_silent_worker_that_beat_after_a_later_sweep(store):
    """A worker beats every 2 s at most, a sweeper sweeps every second: a sweep may come between the
    change and the beat after it. The worker that beats then and finds its server hung before it reads
    the value again still holds the value it read with its beat before (60), and kills at half of it."""
    me = queuectl.host_identity()
    store.register("remote", {**me, "host": "elsewhere", "boot_id": "other-boot"}, 1, T0)
    register(store, "me")
    store.enqueue([spec("a")], T0)
    store.claim("remote", T0)
    store.config_set("stale_timeout", 60)
    sweeper = queuectl.Sweeper(store, me, "me")
    assert sweeper.sweep(T0, now_mono=1000.0) == 0
    store.heartbeat("remote", T0)  # it reads 60 with this beat
    store.config_set("stale_timeout", 4)
    assert sweeper.sweep(T0, now_mono=1001.0) == 0  # this beat seen moving, after the change
    assert sweeper.sweep(T0, now_mono=1002.0) == 0  # a sweep before its next beat
    store.heartbeat("remote", T0)  # its last beat: the read after it hangs, it still holds 60
    assert sweeper.sweep(T0, now_mono=1003.0) == 0
    assert sweeper.sweep(T0, now_mono=1010.0) == 0  # 7 s: it kills its run only at 30 s
    assert sweeper.sweep(T0, now_mono=1063.0) == 0
    assert store.get("a").state == "processing"
    assert sweeper.sweep(T0, now_mono=1064.5) == 1


def test_lease_time_excludes_the_time_our_own_heartbeat_was_stalled(store):
    """A long write holds the database: nobody can beat, us included. That time is nobody's fault."""
    me = queuectl.host_identity()
    store.register("remote", {**me, "host": "elsewhere", "boot_id": "other-boot"}, 1, T0)
    register(store, "me")
    store.enqueue([spec("a")], T0)
    store.claim("remote", T0)
    stalled = [0.0]
    sweeper = queuectl.Sweeper(store, me, "me", lambda: stalled[0])
    assert sweeper.sweep(T0, now_mono=1000.0) == 0
    stalled[0] = 7.6  # our heartbeat waited 7.6 s for the lock
    assert sweeper.sweep(T0, now_mono=1012.0) == 0  # 12 s silent, of which 7.6 s stalled
    assert store.get("a").state == "processing"
    assert sweeper.sweep(T0, now_mono=1017.7) == 1  # 10.1 s of its own silence
    assert queuectl.lease_expired(0.0, 12.0, 10, stalled_s=1.9) and not queuectl.lease_expired(0.0, 12.0, 10, 2.0)


def test_postgres_a_notification_wakes_an_idle_worker_before_its_poll(pg_url, monkeypatch):
    with InProcessWorker(pg_url, monkeypatch), contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.enqueue([spec("a")], s.now())
        wait_for(lambda: s.get("a").state == "completed", "the job to be claimed and run", timeout=20)


def test_postgres_a_worker_listens_again_after_its_connections_were_dropped(pg_url, monkeypatch):
    with InProcessWorker(pg_url, monkeypatch):
        assert terminate_other_sessions(pg_url) >= 3  # the worker's, its runner's, its listener's
        with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
            s.enqueue([spec("a")], s.now())
            wait_for(lambda: s.get("a").state == "completed", "the job to be claimed and run", timeout=20)


class ScriptedListener:
    """A listener for Worker._listen: wait_notified returns (or raises) each of `answers` in turn, and records
    first what the worker made of the one before (then clears the tick and marks a lookup as just made);
    once they are all given, it stops the worker."""

    def __init__(self, worker, answers):
        self.worker, self.answers, self.seen, self.closed = worker, list(answers), [], False

    def wait_notified(self, timeout_s):
        w = self.worker
        self.seen.append((w.listening, w.schedules.check_s, w.schedules.checked_at, w.tick.is_set(), w.wakes))
        w.tick.clear()
        w.schedules.checked_at = 100.0
        if not self.answers:
            w.stopping.set()
            return set()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self):
        self.closed = True


def test_a_listener_makes_the_worker_look_at_schedules_on_a_change_and_wake_a_runner_for_a_job(tmp_path):
    """A schedule's change makes the main loop look up schedules at once (look_soon and the tick), a job a runner
    claim (and the main loop poll); while the listener hears, the regular checks are every
    NOTIFIED_POLL_INTERVAL_S, and after a failure every second again, starting at once, until it hears again."""
    worker, changed = queuectl.Worker(str(tmp_path / "q.db"), 1, False), queuectl.SCHEDULES_CHANGED
    listener = ScriptedListener(worker, [set(), {changed}, {""}, {"", changed},
                                         queuectl.BadDatabase("connection lost (injected)"), set()])
    try:
        worker._listen(listener, queuectl.Backoff("listening for wake-ups", 5.0))
    finally:
        worker.store.close()
    heard, alone, wakes = queuectl.NOTIFIED_POLL_INTERVAL_S, queuectl.SCHEDULE_CHECK_S, listener.seen[0][4]
    assert heard > alone
    assert [(listening, check_s, checked_at, tick, woken - wakes)
            for listening, check_s, checked_at, tick, woken in listener.seen] == [
        (False, alone, -math.inf, False, 0),  # before anything was heard
        (True, heard, 100.0, False, 0),  # nothing: no lookup, no runner woken
        (True, heard, -math.inf, True, 0),  # a schedule changed: look now
        (True, heard, 100.0, True, 1),  # a job: one runner
        (True, heard, -math.inf, True, 2),  # both
        (False, alone, -math.inf, True, 2),  # the connection failed: what it would have heard is lost, look now
        (True, heard, 100.0, False, 2)]  # it listens again
    assert listener.closed


def test_the_regular_check_is_every_5s_while_the_listener_hears_and_every_second_otherwise(tmp_path):
    worker = queuectl.Worker(str(tmp_path / "q.db"), 1, False)
    try:
        assert worker._poll(100.0) == 100.0 + queuectl.POLL_INTERVAL_S  # an empty queue: no due time sooner
        worker.listening = True
        assert worker._poll(100.0) == 100.0 + queuectl.NOTIFIED_POLL_INTERVAL_S == 105.0
    finally:
        worker.store.close()


class Running:
    current = True  # a Runner with a job running, as Worker._poll sees it


def test_a_worker_that_is_not_at_rest_looks_every_second_even_while_its_listener_hears(tmp_path):
    """No NOTIFY comes when a job ends: a burst worker waiting for another process's job to end (to exit), and a
    worker with a job running or due (a runner that lost its claim to another process waits for the poll), look
    every second; only a worker at rest, listening, looks every NOTIFIED_POLL_INTERVAL_S. (A burst worker that
    waited 5 s at the end of each drain made two burst processes slower than one on PostgreSQL.)"""
    path = str(tmp_path / "q.db")
    burst, worker = queuectl.Worker(path, 1, True), queuectl.Worker(path, 1, False)
    try:
        burst.listening = worker.listening = True
        register(worker.store, "other", worker.store.now())
        worker.store.enqueue([spec("a")], worker.store.now())
        worker.store.claim("other", worker.store.now())  # running in another process: the burst worker waits
        assert burst._poll(100.0) == 101.0 and not burst.stopping.is_set()
        worker.store.enqueue([spec("b")], worker.store.now())
        assert worker._poll(100.0) == 101.0  # due
        worker.store.claim("other", worker.store.now())
        assert worker._poll(100.0) == 105.0  # at rest: nothing due, nothing of its own running
        worker.runners.append(Running())
        assert worker._poll(100.0) == 101.0  # a job of its own running
    finally:
        burst.store.close()
        worker.store.close()


def test_postgres_an_idle_worker_fires_a_schedule_added_resumed_or_changed_at_once(pg_url, monkeypatch):
    """The worker's schedule lookup an hour away (InProcessWorker's checks are too): it fires a slot only
    because the NOTIFY of an add, a resume or an update made it look (or at a slot it learnt of so)."""
    monkeypatch.setattr(queuectl, "SCHEDULE_CHECK_S", 3600.0)
    with InProcessWorker(pg_url, monkeypatch) as running, contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        worker = running.worker
        wait_for(lambda: worker.listening and worker.schedules.checked_at > -math.inf, "the first schedule lookup")

        def fired(schedule_id):
            return len([job_id for job_id in slot_job_ids(s) if job_id.startswith(f"{schedule_id}@")])

        def knows_only_hourly_slots():
            return worker.schedules.due_at > s.now() + 60
        add_schedule(s, now=s.now(), id="hourly", every="1h")
        add_schedule(s, now=s.now(), id="s", every="1s")
        wait_for(lambda: fired("s"), "the added schedule to fire")
        s.pause_schedules(["s"])
        wait_for(knows_only_hourly_slots, "the worker to look past the paused schedule")
        before = fired("s")
        s.resume_schedules(["s"], s.now())
        wait_for(lambda: fired("s") > before, "the resumed schedule to fire")
        s.remove_schedules(["s"])
        wait_for(knows_only_hourly_slots, "the worker to look past the removed schedule")
        s.update_schedule(queuectl.validate_schedule({"id": "hourly", "every": "1s", "tz": "UTC", "command": "true"},
                                                     CONFIG_DEFAULTS_INTERNAL, "/", s.now()))
        wait_for(lambda: fired("hourly"), "the changed schedule to fire")


def test_postgres_a_worker_whose_listener_fails_looks_for_jobs_at_once_and_then_every_second(pg_url, monkeypatch):
    """While its listener hears, a worker's regular check is seldom (an hour here, NOTIFIED_POLL_INTERVAL_S in
    production). When the listener fails and cannot listen again, what is notified is lost: the worker looks at
    once and then every POLL_INTERVAL_S, not only at the seldom check it had planned."""
    with InProcessWorker(pg_url, monkeypatch) as running, contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        worker = running.worker
        wait_for(lambda: worker.listening, "the listener to hear")
        monkeypatch.setattr(queuectl, "POLL_INTERVAL_S", 0.2)

        def lost(self, timeout_s):
            raise queuectl.BadDatabase("connection lost (injected)")
        monkeypatch.setattr(queuectl.PostgresStore, "wait_notified", lost)
        wait_for(lambda: not worker.listening, "the listener to fail")
        s.enqueue([spec("a")], s.now())  # its NOTIFY is heard by nobody
        wait_for(lambda: s.get("a").state == "completed", "the regular check to find the job", timeout=20)


def test_a_heartbeat_that_came_late_counts_as_stalled(tmp_path, monkeypatch):
    worker = queuectl.Worker(str(tmp_path / "s.db"), 1, False)
    try:
        worker.store.register(worker.worker_id, worker.me, 1, T0)
        monkeypatch.setattr(queuectl.time, "monotonic", lambda: 100.0)
        assert worker._beat(due_mono=93.0) == 100.0 + 2.0  # due at 93, done at 100; next in 2 s
        assert worker.stalled_s == 7.0
    finally:
        worker.store.close()


def test_flush_output_never_waits_for_a_busy_database(sqlite_store):
    register(sqlite_store)
    sqlite_store.enqueue([spec("j")], T0)
    job = sqlite_store.claim("w1", T0)
    other = sqlite3.connect(sqlite_store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert sqlite_store.flush_output(job, b"x", 1) is False
        assert time.monotonic() - started < queuectl.BUSY_TIMEOUT_S  # no busy wait at all (it is 1 s)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert sqlite_store.read("PRAGMA busy_timeout") == [(int(queuectl.BUSY_TIMEOUT_S * 1000),)]
    assert sqlite_store.flush_output(job, b"x", 1) is True


def test_run_duration_comes_from_the_monotonic_clock(store):
    """The wall clock stepped back 100 s while the job ran 2 s: the run still took 2 s."""
    register(store)
    store.enqueue([spec("j")], T0)
    job = store.claim("w1", T0)
    store.finish(job, "w1", outcome(duration=2.0), SETTINGS, T0 - 100)
    run = store.runs("j")[0]
    assert run["ended_at"] - run["started_at"] == 2.0
    store.enqueue([spec("lost")], T0)
    lost = store.claim("w1", T0)
    store.interrupt(lost, "w1", LOST, True, T0 - 100)  # nobody measured it: never before its start
    assert store.runs("lost")[0]["ended_at"] == T0


def test_no_fault_in_the_sweep_ends_a_worker(tmp_path, monkeypatch, caplog):
    """A sweep that raises anything (an os.kill refused with PermissionError, say) is logged and
    retried; the worker goes on running jobs."""
    path = str(tmp_path / "f.db")
    with opened(path) as s:
        s.enqueue([spec("a")], time.time())
    calls = []

    def failing_sweep(self, now, now_mono=None):
        calls.append(now)
        if len(calls) > 1:  # the first, before the threads start, is not in the loop
            raise PermissionError(1, "Operation not permitted")
        return 0
    monkeypatch.setattr(queuectl.Sweeper, "sweep", failing_sweep)
    worker = queuectl.Worker(path, 1, True)
    with caplog.at_level("WARNING", logger="queuectl"):
        assert worker.run() == 0
    assert worker.store.get("a").state == "completed" and len(calls) > 1
    assert any("housekeeping failed: [Errno 1] Operation not permitted" in r.getMessage() for r in caplog.records)
    worker.store.close()


def test_an_adopted_job_whose_requeue_failed_is_requeued_at_a_later_sweep(store, monkeypatch):
    me = queuectl.host_identity()
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.register("dead", {**me, "pid": dead.pid, "proc_start": "1"}, 1, T0)
    register(store, "me")
    store.enqueue([spec("j")], T0)
    store.claim("dead", T0)
    real_interrupt = queuectl.Store.interrupt
    def full_once(self, *args):
        monkeypatch.setattr(queuectl.Store, "interrupt", real_interrupt)
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(queuectl.Store, "interrupt", full_once)
    with pytest.raises(sqlite3.OperationalError):
        queuectl.Sweeper(store, me, "me").sweep(T0 + 1)
    assert (store.get("j").state, store.get("j").worker_id) == ("processing", "me")
    # A new Sweeper (no memory of it, as after any lost state) finds its adopted job in the database.
    assert queuectl.Sweeper(store, me, "me").sweep(T0 + 2) == 1
    assert store.get("j").state == "pending"


# ---- wake-ups: what makes a job due wakes an idle worker, which sleeps until the next due time ------
# InProcessWorker's regular check and idle wait are an hour: a job these tests see run was found
# through a wake-up, or at the due time the worker computed.

def test_an_enqueue_wakes_an_idle_worker(db, monkeypatch):
    with InProcessWorker(db, monkeypatch), contextlib.closing(queuectl.open_database(db)) as s:
        s.enqueue([spec("a")], s.now())
        wait_for(lambda: s.get("a").state == "completed", "the job to be claimed and run")


def test_a_delayed_job_and_a_retry_start_at_their_time_with_no_wake_up_then(db, monkeypatch, tmp_path):
    with InProcessWorker(db, monkeypatch), contextlib.closing(queuectl.open_database(db)) as s:
        s.config_set("backoff_base", 1)
        at = s.now() + 1.0
        s.enqueue([spec("later", run_at=at)], s.now())
        flaky = f"test -e {tmp_path}/failed || {{ touch {tmp_path}/failed; exit 1; }}"  # fails once, then not
        s.enqueue([spec("flaky", flaky)], s.now())
        wait_for(lambda: s.get("later").state == "completed", "the delayed job to run at its time")
        assert s.runs("later")[0]["started_at"] >= at
        wait_for(lambda: s.get("flaky").state == "completed", "the retry to run once its backoff is over")
        assert [run["outcome"] for run in s.runs("flaky")] == ["failed", "completed"]


def test_a_freed_slot_a_finished_dependency_a_resume_and_a_dlq_retry_wake_an_idle_worker(db, monkeypatch):
    done = queuectl.Outcome(0, None, b"", 0.1)
    with InProcessWorker(db, monkeypatch), contextlib.closing(queuectl.open_database(db)) as s:
        register(s, "other")  # a worker elsewhere, whose jobs the test finishes
        s.set_limit("solo", 1)
        # Due in half an hour, so the idle worker leaves it alone: only a claim from the future takes it.
        s.enqueue([spec("held", queue="solo", run_at=s.now() + 1800)], s.now())
        held = s.claim("other", s.now() + 3600, ("solo",))
        s.enqueue([spec("waits", queue="solo")], s.now())  # the queue is full: no worker may take it
        # Its result, and a claim in a queue with nothing in it: PostgreSQL's one-statement completion.
        s.finish_and_claim(held, "other", done, s.config_all(), s.now(), ("empty",))
        wait_for(lambda: s.get("waits").state == "completed", "the job the limit held to run")
        s.enqueue([spec("parent", run_at=s.now() + 1800), spec("child", depends_on=["parent"])], s.now())
        parent = s.claim("other", s.now() + 3600)
        s.finish(parent, "other", done, s.config_all(), s.now())
        wait_for(lambda: s.get("child").state == "completed", "the dependent to run")
        s.pause(["q"])
        s.enqueue([spec("paused", queue="q"), spec("dead", "exit 3", max_retries=0)], s.now())
        wait_for(lambda: s.get("dead").state == "dead", "the failing job to reach the DLQ")
        s.resume(["q"])
        wait_for(lambda: s.get("paused").state == "completed", "the resumed queue's job to run")
        s.retry_dead(["dead"], s.now())
        wait_for(lambda: len(s.runs("dead")) == 2, "the retried job to run again")


def test_a_worker_on_sqlite_takes_any_datagram_as_a_hint_only(sqlite_db, monkeypatch):
    with InProcessWorker(sqlite_db, monkeypatch) as worker, contextlib.closing(queuectl.open_database(sqlite_db)) as s:
        s.enqueue([spec("tomorrow", run_at=s.now() + 86400)], s.now())
        address = queuectl.wake_address(os.stat(sqlite_db), worker.worker.worker_id)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as hostile:
            hostile.setblocking(False)
            for payload in [b"", b"\xff" * 60000, b"claim tomorrow", os.urandom(512)] * 50:
                with contextlib.suppress(BlockingIOError):  # its queue full: the rest are dropped
                    hostile.sendto(payload, address)
        s.enqueue([spec("now")], s.now())
        wait_for(lambda: s.get("now").state == "completed", "a real wake-up to work still")
        assert s.get("tomorrow").state == "pending" and worker.thread.is_alive()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as late, pytest.raises(ConnectionRefusedError):
        late.sendto(b"", address)  # the socket went with the worker


def test_a_worker_whose_wake_up_address_is_taken_still_finds_jobs_at_its_regular_check(sqlite_db, monkeypatch, caplog):
    monkeypatch.setattr(queuectl, "wake_address", lambda db, worker_id: b"\0queuectl-test/" + str(os.getpid()).encode())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as squatter:
        squatter.bind(queuectl.wake_address(None, ""))
        with InProcessWorker(sqlite_db, monkeypatch) as worker, \
                contextlib.closing(queuectl.open_database(sqlite_db)) as s:
            monkeypatch.setattr(queuectl, "POLL_INTERVAL_S", 0.2)
            worker.worker.tick.set()  # the hour-long wait ends: the next one is the new interval
            s.enqueue([spec("a")], s.now())
            wait_for(lambda: s.get("a").state == "completed", "the regular check to find the job")
    assert "no wake-ups" in caplog.text



def test_a_worker_looks_again_no_sooner_than_a_tick_for_jobs_falling_due_in_a_paused_queue(db, monkeypatch):
    worker = queuectl.Worker(db, 1, False)
    try:
        worker.store.pause(["q"])
        worker.store.enqueue([spec("soon", queue="q", run_at=T0 + 0.001), spec("next", queue="q", run_at=T0 + 0.002)],
                             T0)
        monkeypatch.setattr(worker.store, "now", lambda: T0)
        # Not at each due time: jobs due close together that no claim takes would keep it looking, a busy loop.
        assert worker._poll(100.0) == 100.0 + queuectl.TICK_GAP_S
    finally:
        worker.store.close()


def test_a_flood_of_datagrams_is_read_one_gulp_per_tick_not_as_fast_as_it_comes(sqlite_db):
    worker = queuectl.Worker(sqlite_db, 1, False)
    heard, flooded = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    looks, pauses = [], []

    class Tick:
        def set(self):
            looks.append(1)

    class Ended:
        def wait(self, timeout):
            pauses.append(len(looks))
            heard.shutdown(socket.SHUT_RDWR)
    worker.tick, worker.ended = Tick(), Ended()
    try:
        flooded.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            for _ in range(200):
                flooded.send(b"x")
        hearing = threading.Thread(target=worker._hear, args=(heard,), daemon=True)
        hearing.start()
        wait_for(lambda: pauses or len(looks) > 1, "the flood to be heard")
        with contextlib.suppress(OSError):
            heard.shutdown(socket.SHUT_RDWR)
        hearing.join(timeout=10)
        assert pauses[:1] == [1]  # one gulp, one look, then a pause before it reads more
    finally:
        flooded.close()
        worker.store.close()

# ---- real workers: running, retrying, timing out, recovering jobs --------------------------------

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


@pytest.mark.parametrize("command", ["sleep 60", "sh -c 'sleep 60; true'"])
def test_a_sigkilled_worker_takes_its_jobs_first_process_with_it(pg_url, pg_workers, tmp_path, command):
    """On PostgreSQL a lost run may rerun on another host, which cannot kill what is left of it here."""
    db, workers = pg_url, pg_workers
    enqueue(db, id="j", command=command, cwd=str(tmp_path))
    worker = workers.start()
    [first] = wait_for(lambda: job_leaders(workers.tag, worker.popen.pid), "the job to start")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: pid_gone(first), "the job's first process to die with its worker", timeout=10)


def test_two_idle_sweepers_never_start_an_overlapping_run(db, workers, tmp_path):
    """The worker of a job holding a flock and 1.5 GiB dies; two idle workers sweep. The rerun must
    find the lock free: recovery waits for every process of the lost run to be gone."""
    enqueue(db, id="hog", command=LOCKED_MEMORY_JOB.format(python=sys.executable), cwd=str(tmp_path), max_retries=1)
    victim = workers.start()
    wait_for(lambda: (tmp_path / "runs").exists(), "the job to hold its lock and memory", timeout=60)
    sweepers = [workers.start(), workers.start()]
    for sweeper in sweepers:
        sweeper.wait_log("worker started")
    victim.signal(signal.SIGKILL)
    wait_for(lambda: len((tmp_path / "runs").read_text().split()) == 2 or state_of(db, "hog") == "dead",
             "the rerun to start", timeout=60)
    job = get_job(db, "hog")
    assert job["state"] == "processing" and job["run_count"] == 2, job  # not dead: flock -n found the lock free
    assert json.loads(ok(db, "show", "hog", "--json"))["runs"][0]["outcome"] == "lost"


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
    assert (job["state"], job["attempts"], job["lost_count"]) == ("completed", 0, 1)
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


def test_a_notification_job_gets_the_dead_jobs_facts_in_its_environment_and_its_last_output_on_stdin(
        db, workers, tmp_path):
    ok(db, "config", "set", "on-dead", "env | grep ^QUEUECTL_ | sort > env.txt; cat > stdin.txt")
    enqueue(db, id="doomed", command="echo first line; printf 'last line'; exit 3", max_retries=1, cwd=str(tmp_path))
    # Other jobs still read nothing, even one whose env looks like a notification's.
    enqueue(db, id="plain", command="cat > plain.txt", cwd=str(tmp_path))
    enqueue(db, id="fake", command="cat > fake.txt", cwd=str(tmp_path),
            env={"QUEUECTL_DEAD_JOB_ID": "doomed", "QUEUECTL_DEAD_RUN": "1"})
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    notice = next(j for j in json.loads(ok(db, "list", "--json")) if j["id"].startswith("doomed@dead-"))
    assert notice["state"] == "completed", worker.log()
    env = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    assert {k: v for k, v in env.items() if k.startswith("QUEUECTL_DEAD_")} == {
        "QUEUECTL_DEAD_JOB_ID": "doomed", "QUEUECTL_DEAD_QUEUE": "default", "QUEUECTL_DEAD_ATTEMPTS": "1",
        "QUEUECTL_DEAD_EXIT_CODE": "3", "QUEUECTL_DEAD_ERROR": "exit code 3", "QUEUECTL_DEAD_RUN": "1"}
    assert env["QUEUECTL_JOB_ID"] == notice["id"] and env["QUEUECTL_ATTEMPT"] == "1"  # and its own, as every job
    assert (tmp_path / "stdin.txt").read_text() == "first line\nlast line"
    assert (tmp_path / "plain.txt").read_text() == "" and (tmp_path / "fake.txt").read_text() == ""


def test_a_notification_job_whose_dead_jobs_folder_is_gone_runs_in_the_root_folder(db, workers, tmp_path):
    """A job often dies because its folder was removed: its notification must still tell (a job that only
    looks like one still cannot start there)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    ok(db, "config", "set", "on-dead", f"pwd > {tmp_path}/told.txt")
    enqueue(db, id="doomed", command="true", max_retries=1, cwd=str(gone))
    enqueue(db, id="fake", command="true", max_retries=1, cwd=str(gone), on_dead="",
            env={"QUEUECTL_DEAD_JOB_ID": "doomed", "QUEUECTL_DEAD_RUN": "1"})
    gone.rmdir()
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    states = {j["id"]: j["state"] for j in json.loads(ok(db, "list", "--json"))}
    assert states == {"doomed": "dead", "fake": "dead", "doomed@dead-1-0": "completed"}, worker.log()
    assert (tmp_path / "told.txt").read_text() == "/\n"


def test_a_burst_worker_waits_for_the_retry_of_a_notification_job_in_a_paused_queue(db, workers, tmp_path):
    ok(db, "config", "set", "on-dead", "exit 1")
    ok(db, "config", "set", "max-retries", "2")
    ok(db, "config", "set", "backoff-base", "1")  # the notification's retry falls due a second after it failed
    enqueue(db, id="doomed", command="true", queue="night", cwd=str(tmp_path))
    ok(db, "pause", "--queue", "night")
    ok(db, "cancel", "doomed")
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    notice = next(j for j in json.loads(ok(db, "list", "--json")) if j["id"].startswith("doomed@dead-"))
    assert (notice["state"], notice["attempts"]) == ("dead", 2), worker.log()


def test_each_death_is_notified_once_while_cancels_race_two_workers(db, workers, tmp_path):
    """Two worker processes record failures while this process cancels the same jobs: each job dies
    once, by whichever wins, and so has exactly one notification job."""
    ok(db, "config", "set", "on-dead", "true")
    ids = [f"j{i}" for i in range(30)]
    assert cli(db, "enqueue", "-", stdin=jsonl(*({"id": i, "command": "exit 1", "max_retries": 1, "queue": "work",
                                                  "cwd": str(tmp_path)} for i in ids)))[0] == 0
    for _ in range(2):
        workers.start("--queue", "work")
    for job_id in ids:  # racing the results: some are canceled, some already dead (refused: exit 1)
        assert cli(db, "cancel", job_id)[0] in (0, 1)
    wait_for(lambda: all(c == 0 for s, c in json.loads(ok(db, "status", "--json"))["jobs"].items()
                         if s in ("pending", "processing", "failed")), "every job and notification to end")
    jobs = json.loads(ok(db, "list", "--json"))
    assert {j["id"]: j["state"] for j in jobs if j["id"] in ids} == dict.fromkeys(ids, "dead")
    made = sorted(j["env"]["QUEUECTL_DEAD_JOB_ID"] for j in jobs if j["id"] not in ids)
    assert made == sorted(ids)


# ---- the drain: a shared SQLite connection, the environment, malloc arenas, the WAL --------------

def test_sqlite_runners_share_one_connection_and_postgres_runners_have_their_own(db):
    worker = queuectl.Worker(db, 2, True)
    try:
        first, second = worker._runner_store(), worker._runner_store()
        if db.startswith("postgresql://"):
            assert first is not second and not first.one_writer
            second.close()
        else:
            assert first is second and first.shared and first.one_writer
        first.close()
    finally:
        worker.store.close()


def test_a_shared_sqlite_store_reads_only_in_its_turn(sqlite_db):
    """One connection is never used by two threads at once: a read waits while another thread holds
    the process's turn (a write under way), and goes through once it is released."""
    import threading
    shared = queuectl.SqliteStore(sqlite_db, shared=True)
    done = threading.Event()
    try:
        with shared.turn:
            reader = threading.Thread(target=lambda: (shared.config_all(), done.set()))
            reader.start()
            assert not done.wait(0.3)  # an event that must not happen: the bounded wait is the test
        assert done.wait(30)
        reader.join(30)
        with shared.turn:  # re-entrant: a read inside a turn this thread holds does not deadlock
            assert shared.config_all()["max_retries"] == queuectl.CONFIG["max_retries"][0]
    finally:
        shared.close()


def test_a_burst_worker_wakes_its_main_loop_when_a_runner_finds_nothing(sqlite_db):
    worker = queuectl.Worker(sqlite_db, 1, True)
    try:
        worker.store.register(worker.worker_id, worker.me, 1, worker.store.now())
        worker.stopping.set()  # one round of the runner loop would run: none, as it is stopping
        worker._thread_main()
        assert worker.tick.is_set()  # a runner thread that ends wakes the main loop
    finally:
        worker.store.close()


def test_a_long_drain_keeps_the_wal_near_sqlites_default_checkpoint_size(sqlite_db, workers):
    """A worker's commits checkpoint the WAL at SQLite's default 1,000 pages; moving that to the main
    loop's PASSIVE checkpoint (which runs beside the runners' commits, so the WAL is never fully copied
    when a writer starts and never restarts) let the file grow to the runners' 10,000-page safety
    limit (40 MB) on every long drain, and stay that size while the worker runs."""
    n = 1500  # about ten WAL pages a job: well past 10,000 pages if nothing restarts the WAL
    lines = "".join('{"command": "true"}\n' for _ in range(n))
    code, _, err = cli(sqlite_db, "enqueue", "-", "--no-progress", stdin=lines)
    assert code == 0, err
    # An idle connection (no transaction) keeps the -wal file once the worker exits, at its largest size.
    keeper = sqlite3.connect(sqlite_db, isolation_level=None)
    try:
        page = keeper.execute("PRAGMA page_size").fetchone()[0]
        assert keeper.execute("SELECT count(*) FROM jobs").fetchone()[0] == n  # opened: holds the -wal
        worker = workers.start("--burst", "--count", "2", "--quiet")
        assert worker.wait() == 0, worker.log()
        assert json.loads(ok(sqlite_db, "status", "--json"))["jobs"]["completed"] == n
        frames = (os.path.getsize(sqlite_db + "-wal") - 32) // (page + 24)
        assert frames <= 3000, f"the WAL grew to {frames} pages"
    finally:
        keeper.close()


def test_an_idle_worker_does_not_checkpoint_its_heartbeats_into_the_database_file(sqlite_db, workers):
    """Workers commit with synchronous=NORMAL: a heartbeat appends to the WAL and syncs nothing. A
    checkpoint at every round of the main loop copied each heartbeat into the database file at once,
    with three fdatasyncs (the WAL restarted, the WAL, the file): every heartbeat of an idle worker
    (every 2 s by default) touched and synced the disk."""
    ok(sqlite_db, "config", "set", "stale-timeout", "1")  # a heartbeat every 0.2 s
    worker = workers.start()
    worker.wait_log("worker started")
    watcher = sqlite3.connect(sqlite_db, isolation_level=None)
    try:
        def beats():
            return watcher.execute("SELECT coalesce(sum(beat), 0) FROM workers").fetchone()[0]
        first = wait_for(beats, "a first heartbeat")
        wait_for(lambda: beats() >= first + 2, "two more heartbeats")  # the worker's start-up writes are done
        before = os.stat(sqlite_db).st_mtime_ns
        start = beats()
        wait_for(lambda: beats() >= start + 5, "five more heartbeats")
        assert os.stat(sqlite_db).st_mtime_ns == before, "an idle worker wrote the database file"
    finally:
        watcher.close()


@pytest.mark.parametrize("env, calls", [(None, [(-8, 2)]), ("4", [])])
def test_a_worker_caps_malloc_arenas_at_two_unless_the_environment_chose(monkeypatch, env, calls):
    """Each arena glibc gives a thread keeps what was freed in it: with --count 8 that held a quarter of
    the worker's peak RSS. MALLOC_ARENA_MAX, read by glibc itself at start, is the user's and wins."""
    import ctypes
    seen = []

    class Libc:
        def mallopt(self, param, value):
            seen.append((param, value))
            return 1
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    if env is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    else:
        monkeypatch.setenv("MALLOC_ARENA_MAX", env)
    queuectl._few_malloc_arenas()
    assert seen == (calls if queuectl.on_glibc() else [])


# ---- a worker's database connection: lost claim answers, timeouts, outages -----------------------

def socket_options(store):
    """(TCP_USER_TIMEOUT ms, SO_KEEPALIVE, TCP_KEEPIDLE s, TCP_KEEPCNT) of a PostgresStore's socket."""
    import socket
    with socket.socket(fileno=os.dup(store.conn.pgconn.socket)) as s:
        return (s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))


def test_postgres_burst_worker_runs_jobs_retries_and_records_output(pg_url, tmp_path):
    ok(pg_url, "config", "set", "backoff-base", "1")
    enqueue(pg_url, id="hello", command="echo hi from postgres")
    enqueue(pg_url, id="bad", command="echo oops; exit 3", max_retries=2)
    enqueue(pg_url, id="after", command="echo after", depends_on=["hello"])
    done = script(pg_url, "worker", "start", "--burst", "--count", "2")
    assert done.returncode == 0, done.stderr
    assert "postgresql://" in done.stderr and "@127.0.0.1:" in done.stderr  # the log names the database
    assert [get_job(pg_url, i)["state"] for i in ("hello", "bad", "after")] == ["completed", "dead", "completed"]
    assert ok(pg_url, "logs", "hello") == "hi from postgres\n"
    assert [r["outcome"] for r in get_job(pg_url, "bad")["runs"]] == ["failed", "dead"]
    assert json.loads(ok(pg_url, "worker", "list", "--json")) == []  # deregistered on exit


def test_postgres_a_short_outage_costs_a_running_job_nothing(pg_url, tmp_path):
    pool = Workers(pg_url, tmp_path)
    try:
        enqueue(pg_url, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
        worker = pool.start()
        wait_for(lambda: (tmp_path / "started").exists(), "the job to start")
        assert terminate_other_sessions(pg_url) >= 3  # the worker's connections: dropped, not refused
        worker.wait_log("failed")  # it noticed, and reconnects
        (tmp_path / "release").touch()
        wait_for(lambda: get_job(pg_url, "long")["state"] == "completed", "the job to complete")
        job = get_job(pg_url, "long")
        assert [(r["outcome"], r["output"]) for r in job["runs"]] == [("completed", "finished\n")]
        assert job["lost_count"] == 0 and worker.popen.poll() is None
        assert "killing" not in worker.log()
    finally:
        pool.cleanup()


def test_postgres_a_worker_cut_off_from_the_server_kills_its_jobs_before_its_lease_ends(own_pg, tmp_path):
    url, stale_s = own_pg.url, 3.0
    ok(url, "config", "set", "stale-timeout", str(stale_s))
    pool = Workers(url, tmp_path)
    try:
        enqueue(url, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
        worker = pool.start()
        wait_for(lambda: (tmp_path / "started").exists(), "the job to start")
        first = int((tmp_path / "sh.pid").read_text())
        own_pg.stop()
        stopped = time.monotonic()  # the worker's last heartbeat went through before this
        wait_for(lambda: pid_gone(first), "the job to be killed", timeout=4 * stale_s)
        assert time.monotonic() - stopped < stale_s, "killed too late: a rerun elsewhere could overlap it"
        assert worker.popen.poll() is None  # the worker stays up
        (tmp_path / "started").unlink()
        own_pg.start()
        wait_for(lambda: (tmp_path / "started").exists(), "the job to run again")
        (tmp_path / "release").touch()
        wait_for(lambda: get_job(url, "long")["state"] == "completed", "the rerun to complete")
        job = get_job(url, "long")
        assert [r["outcome"] for r in job["runs"]] == ["lost", "completed"]
        assert (job["lost_count"], job["runs"][0]["error"]) == (1, "worker cut off from the database")
        assert "half of stale-timeout" in worker.log() and worker.popen.poll() is None
    finally:
        pool.cleanup()


def test_sqlite_worker_never_kills_its_jobs_for_a_failing_heartbeat(tmp_path):
    worker = queuectl.Worker(str(tmp_path / "s.db"), 1, False)
    try:
        worker.beat_ok_at = time.monotonic() - 3600  # an hour without a heartbeat
        assert not worker.cut_off() and worker.abort_reason(make_job(), 0) is None
    finally:
        worker.store.close()


def test_postgres_a_worker_that_cannot_heartbeat_kills_at_half_the_stale_timeout(pg_url):
    worker = queuectl.Worker(pg_url, 1, False)
    try:
        worker.stale_s = 4.0
        worker.beat_ok_at = time.monotonic() - 1.9
        assert worker.abort_reason(make_job(), 0) is None
        worker.beat_ok_at = time.monotonic() - 2.1
        assert worker.abort_reason(make_job(), 0) == queuectl.CUT_OFF
    finally:
        worker.store.close()


def test_a_run_no_runner_holds_is_taken_back_after_the_grace_never_a_held_one(store):
    me = queuectl.host_identity()
    store.register("me", me, 1, T0)
    store.enqueue([spec("held"), spec("stray")], T0)
    holdings = queuectl.Holdings()
    assert holdings.take(store.claim("me", T0))
    stray = store.claim("me", T0)  # committed, but its answer never reached a runner
    sweeper = queuectl.Sweeper(store, me, "me", holdings=holdings)
    assert sweeper.sweep(T0, now_mono=1000.0) == 0  # first seen unheld
    assert sweeper.sweep(T0, now_mono=1000.0 + queuectl.STRAY_GRACE_S - 0.5) == 0  # maybe being handed over
    assert sweeper.sweep(T0 + 1, now_mono=1000.0 + queuectl.STRAY_GRACE_S + 3600) == 1
    assert store.get("held").state == "processing"  # held for an hour by a runner: never taken back
    job = store.get("stray")
    assert (job.state, job.attempts, job.lost_count, job.worker_id) == ("pending", 0, 1, None)
    assert [(r["outcome"], r["error"]) for r in store.runs("stray")] == [("lost", "claim answer lost")]
    assert not holdings.take(stray)  # its answer, arriving now, is not run
    again = store.claim("me", T0 + 2)
    assert (again.id, again.run_count) == ("stray", 2) and holdings.take(again)  # the rerun is a new run
    assert sweeper.sweep(T0 + 3, now_mono=1000.0 + 2 * queuectl.STRAY_GRACE_S + 7200) == 0


def test_a_runner_does_not_run_a_claim_answered_after_it_was_taken_back(store):
    register(store, "me")
    store.enqueue([spec("a")], T0)
    holdings = queuectl.Holdings()
    assert holdings.take_back(("a", 1), 0.0)  # the worker gave up waiting for this claim's answer
    runner = queuectl.Runner(store, "me", lambda job, registration: None, holdings=holdings)
    ran = []
    runner.execute = lambda job, env, abort, on_output: ran.append(job.id) or outcome()
    assert runner.run_once(now=T0) is False and ran == []
    assert (store.get("a").state, runner.current) == ("processing", None)  # left to the sweeper


def test_a_claim_whose_answer_was_lost_is_requeued_and_runs_once(db, workers, tmp_path):
    enqueue(db, id="busy", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start("--count", "1")
    wait_for(lambda: (tmp_path / "started").exists(), "the busy job to start")
    worker_id = json.loads(ok(db, "worker", "list", "--json"))[0]["id"]
    enqueue(db, id="target", command="echo ran >> ran.txt", cwd=str(tmp_path))
    store = queuectl.open_database(db)
    try:
        # What a claim whose answer was lost with the connection leaves: committed for this worker,
        # unknown to its runners (its only runner is busy with the other job).
        assert store.claim(worker_id, store.now()).id == "target"
    finally:
        store.close()
    worker.wait_log("no runner got the claim's answer")
    assert state_of(db, "busy") == "processing"  # running longer than the grace: never taken back
    (tmp_path / "release").touch()
    wait_for(lambda: state_of(db, "target") == "completed", "the requeued job to run")
    job = get_job(db, "target")
    assert [(r["outcome"], r["error"]) for r in job["runs"]] == [("lost", "claim answer lost"), ("completed", None)]
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    assert [r["outcome"] for r in get_job(db, "busy")["runs"]] == ["completed"]


def test_a_worker_connection_is_bounded_by_a_quarter_of_stale_timeout():
    for stale_s in (8, 10, 60, 3600):
        params = queuectl.pg_lease_params(stale_s)
        assert params["keepalives"] == 1 and params["tcp_user_timeout"] == stale_s * 250
        probing_s = params["keepalives_idle"] + params["keepalives_interval"] * params["keepalives_count"]
        assert probing_s <= max(stale_s / 4, 4) and params["connect_timeout"] <= max(2, stale_s / 4 + 1)
    small = queuectl.pg_lease_params(1)  # libpq's whole seconds set a floor for small leases
    assert (small["tcp_user_timeout"], small["keepalives_idle"], small["connect_timeout"]) == (250, 1, 2)


def test_postgres_worker_connections_get_timeouts_from_the_lease_and_the_url_wins(pg_url, monkeypatch):
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    command = queuectl.PostgresStore(pg_url)
    worker = queuectl.PostgresStore(pg_url, lease_s=10.0)
    chosen = queuectl.PostgresStore(f"{pg_url}&tcp_user_timeout=1234&keepalives_idle=7&connect_timeout=30",
                                    lease_s=10.0)
    try:
        assert "tcp_user_timeout" not in command.conn.info.get_parameters()  # a command: as before
        assert command.conn.info.get_parameters()["connect_timeout"] == "10"
        params = worker.conn.info.get_parameters()
        assert {k: params.get(k) for k in ("keepalives", "keepalives_idle", "tcp_user_timeout", "connect_timeout")} \
            == {"keepalives": "1", "keepalives_idle": "1", "tcp_user_timeout": "2500", "connect_timeout": "3"}
        assert socket_options(worker) == (2500, 1, 1, 3)  # what the kernel was told
        params = chosen.conn.info.get_parameters()
        assert (params["tcp_user_timeout"], params["keepalives_idle"], params["connect_timeout"]) == \
            ("1234", "7", "30")
        assert socket_options(chosen) == (1234, 1, 7, 3)
        worker.set_lease(60.0)  # `config set stale-timeout 60`: the connection is reopened at its next use
        assert worker.config_get("stale_timeout") == 10
        assert socket_options(worker) == (15000, 1, 7, 3)
    finally:
        for store in (command, worker, chosen):
            store.close()


def test_postgres_a_flush_that_hangs_in_the_database_does_not_delay_a_kill(pg_url, monkeypatch):
    # A flush whose statement does not answer (as over a connection that hangs) runs on a thread of
    # its own: the job's loop still asks abort() and kills it while that flush is blocked.
    monkeypatch.setattr(queuectl.PostgresSQL, "SQL_FLUSH_OUTPUT",
                        "SELECT pg_sleep(3), %s::bytea, %s::bigint, %s::text, %s::bigint")
    monkeypatch.setattr(queuectl, "OUTPUT_FLUSH_S", 0.1)
    store = queuectl.PostgresStore(pg_url)
    try:
        register(store, "me")
        store.enqueue([spec("chatty", command="i=0; while [ $i -lt 400 ]; do echo x; sleep 0.05; i=$((i+1)); done")],
                      store.now())
        killed_while_flushing = []

        def abort(job, registration):
            return queuectl.CUT_OFF if runner.flushing and runner.flushing.is_alive() else None

        def run(*args):
            result = queuectl.run_command(*args)
            killed_while_flushing.append(runner.flushing.is_alive())
            return result
        runner = queuectl.Runner(store, "me", abort)
        runner.execute = run
        assert runner.run_once() is True
        assert killed_while_flushing == [True]
        job = store.get("chatty")
        assert (job.state, job.lost_count) == ("pending", 1)
        assert [(r["outcome"], r["error"]) for r in store.runs("chatty")] == [("lost", queuectl.CUT_OFF)]
    finally:
        store.close()


def test_postgres_a_heartbeat_blocked_by_a_lock_fences_the_job_which_then_runs_again(pg_url, workers, tmp_path):
    import psycopg
    stale_s = 3.0
    ok(pg_url, "config", "set", "stale-timeout", str(stale_s))
    enqueue(pg_url, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    wait_for(lambda: (tmp_path / "started").exists(), "the job to start")
    first = int((tmp_path / "sh.pid").read_text())
    worker_id = json.loads(ok(pg_url, "worker", "list", "--json"))[0]["id"]
    libpq, schema = queuectl._pg_target(pg_url)[:2]
    with psycopg.connect(libpq) as holder:  # its transaction holds the worker's row until the end of the block
        holder.execute(f'SELECT 1 FROM "{schema}".workers WHERE id = %s FOR UPDATE', (worker_id,))
        locked = time.monotonic()  # no heartbeat goes through after this
        wait_for(lambda: pid_gone(first), "the job to be killed", timeout=4 * stale_s)
        assert time.monotonic() - locked < stale_s, "killed too late: a rerun elsewhere could overlap it"
        (tmp_path / "started").unlink()
    wait_for(lambda: (tmp_path / "started").exists(), "the job to run again")
    (tmp_path / "release").touch()
    wait_for(lambda: state_of(pg_url, "long") == "completed", "the rerun to complete")
    job = get_job(pg_url, "long")
    # (Its main loop may have spent the whole cut-off retrying the locked heartbeat, so the cut-off's
    # log line is not asked for: the runner's own check killed the job, and the run says why.)
    assert [(r["outcome"], r["error"]) for r in job["runs"]] == [("lost", queuectl.CUT_OFF), ("completed", None)]
    assert worker.popen.poll() is None


def test_a_claim_that_fails_after_its_commit_is_run_once_by_the_same_worker(db, tmp_path, monkeypatch):
    import threading
    enqueue(db, id="j", command="echo ran >> ran.txt", cwd=str(tmp_path))
    real_claim, failed = queuectl.Store.claim, []

    def claim(self, worker_id, now, queues=(), only=None):
        job = real_claim(self, worker_id, now, queues, only)
        if job and not failed:  # the first claim commits, then its answer is lost
            failed.append(job.id)
            raise queuectl.BadDatabase("connection lost after the commit (injected)")
        return job
    monkeypatch.setattr(queuectl.Store, "claim", claim)
    worker, exits = queuectl.Worker(db, 1, True), []
    burst = threading.Thread(target=lambda: exits.append(worker.run()), daemon=True)
    burst.start()
    burst.join(WAIT_S)
    try:
        assert exits == [0], "the burst worker did not drain the queue"  # it waited for the stray, not forever
    finally:
        if burst.is_alive():
            worker.on_signal(signal.SIGQUIT)
            burst.join(WAIT_S)
        worker.store.close()
    assert failed == ["j"]
    job = get_job(db, "j")
    assert [(r["outcome"], r["error"]) for r in job["runs"]] == [("lost", "claim answer lost"), ("completed", None)]
    assert (tmp_path / "ran.txt").read_text() == "ran\n"


def test_a_flush_whose_thread_cannot_start_is_skipped_and_the_job_runs_on(sqlite_store, monkeypatch):
    # Where flushes run on threads of their own (PostgreSQL), a process at its thread limit cannot
    # start one ("can't start new thread"). The flush is best effort: the job must go on and be
    # recorded as it ended, not as an internal error with its process left running.
    monkeypatch.setattr(queuectl, "OUTPUT_FLUSH_S", 0.05)
    real_start = threading.Thread.start

    def start(self):
        if self.name == "flush":
            raise RuntimeError("can't start new thread")
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    sqlite_store.cut_off_kills = True  # the PostgreSQL path of Runner._flush, on a local file
    register(sqlite_store, "me")
    sqlite_store.enqueue([spec("chatty", command="for i in 1 2 3 4 5 6; do echo x; sleep 0.1; done")],
                         sqlite_store.now())
    runner = queuectl.Runner(sqlite_store, "me", lambda job, registration: None)
    assert runner.run_once() is True
    job = sqlite_store.get("chatty")
    assert (job.state, job.last_error) == ("completed", None)
    assert sqlite_store.runs("chatty")[0]["output"] == b"x\n" * 6


def test_postgres_a_runner_connection_opened_while_stale_timeout_changed_gets_the_new_lease(pg_url):
    # A runner thread opens its connection with stale-timeout as it read it (slowly, while the database
    # was slow to answer); the heartbeat meanwhile reads a new value and bounds the connections of the
    # runners it knows. A runner that joined the list just after that must still get the new lease.
    ok(pg_url, "config", "set", "stale-timeout", "20")
    worker = queuectl.Worker(pg_url, 1, True)
    try:
        worker._read_stale_timeout()  # the heartbeat read 20 ...
        late = worker._new_runner()
        late.store.lease_s = late.store.conn_lease_s = 10.0  # ... while this runner was opened with the old 10
        worker._read_stale_timeout()  # the next heartbeat: stale-timeout unchanged since
        assert late.store.lease_s == 20.0
        late.store.config_get("stale_timeout")  # its next use reopens it with the lease's timeouts
        assert socket_options(late.store)[0] == 5000
    finally:
        for store in [worker.store, *(r.store for r in worker.runners)]:
            store.close()


def test_postgres_connection_parameters_of_a_named_service_win_too(pg_url, tmp_path, monkeypatch):
    # A libpq service (pg_service.conf, named by ?service= or PGSERVICE) is the user's choice as much
    # as the URL: libpq only fills from it what the connection string leaves out, so a value of ours
    # passed to connect() must not override the service's.
    from urllib.parse import urlsplit
    parts = urlsplit(pg_url)
    (tmp_path / "services.conf").write_text("# the team's settings\n[queue]\nkeepalives_idle=7\n"
                                            "tcp_user_timeout=1234\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "services.conf"))
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    schema = dict(q.split("=", 1) for q in parts.query.split("&"))["schema"]
    server = f"postgresql://{parts.netloc}{parts.path}"
    for url, env in ((f"{server}?service=queue&schema={schema}", None), (f"{server}?schema={schema}", "queue")):
        if env:
            monkeypatch.setenv("PGSERVICE", env)
        store = queuectl.PostgresStore(url, lease_s=10.0)
        try:
            params = store.conn.info.get_parameters()
            assert (params["keepalives_idle"], params["tcp_user_timeout"], params["connect_timeout"]) == \
                ("7", "1234", "3")  # the service's two, and ours where it says nothing
        finally:
            store.close()


def test_a_runner_keeps_its_last_settings_when_the_database_cannot_answer(store, monkeypatch):
    # A job being started (output-limit) or stopped (kill-grace) reads the config; a failed read must
    # not fail the run when settings were read before. With nothing read yet, the error stands.
    register(store)
    runner = queuectl.Runner(store, "w1", lambda job, registration: None)
    first = runner._settings()

    def busy():
        raise queuectl.Busy("database is busy")
    monkeypatch.setattr(store, "config_all", busy)
    runner.settings_at = -math.inf  # due for a re-read
    assert runner._settings() == first and runner._kill_grace() == first["kill_grace"]
    runner.settings, runner.settings_at = {}, -math.inf
    with pytest.raises(queuectl.Busy):
        runner._settings()


def test_a_lost_claim_and_its_late_answer_log_events_of_their_own(store, caplog):
    """`--log-format json`: the worker taking back a claim nobody received, and that claim's answer
    arriving after all, were queuectl's own lines logged as the foreign `log` event."""
    me = queuectl.host_identity()
    store.register("me", me, 1, T0)
    store.enqueue([spec("stray")], T0)
    stray = store.claim("me", T0)  # committed, but its answer never reached a runner
    holdings = queuectl.Holdings()
    sweeper = queuectl.Sweeper(store, me, "me", holdings=holdings)
    runner = queuectl.Runner(store, "me", lambda job, registration: None, holdings=holdings)
    with caplog.at_level("WARNING", logger="queuectl"):
        sweeper.sweep(T0, now_mono=1000.0)
        sweeper.sweep(T0 + 1, now_mono=1000.0 + queuectl.STRAY_GRACE_S + 1)
        assert runner._held(stray) is None
    lines = [json.loads(queuectl.JsonLines().format(r)) for r in caplog.records
             if "took it back" in r.getMessage() or "no runner got" in r.getMessage()]
    assert [(line["event"], line["job_id"], line["run"]) for line in lines] == [
        ("claim_unanswered", "stray", 1), ("claim_taken_back", "stray", 1)]


# ---- a server that hangs: kill paths, hard stop and start-up -------------------------------------

@pytest.fixture
def hanging_pg(pg_url):
    """A HangingProxy in front of the test's server, closed (forwarding again first) at teardown."""
    proxy = HangingProxy(pg_url)
    try:
        yield proxy
    finally:
        proxy.close()


def _runs_a_job_after_a_first_failure(db, monkeypatch, cls, name):
    """Start a worker in this process whose cls.name fails once (a connection dropped just after the
    worker registered); it must go on and run a job."""
    failed, real = [], getattr(cls, name)

    def fails_once(self, *args, **kwargs):
        if not failed:
            failed.append(name)
            raise queuectl.BadDatabase("connection lost (injected)")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(cls, name, fails_once)
    worker, exits = queuectl.Worker(db, 1, False), []

    def run():
        try:
            exits.append(worker.run())
        except queuectl.QueueError as e:
            exits.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        enqueue(db, id="j", command="true")
        wait_for(lambda: state_of(db, "j") == "completed" or exits, "the job to run")
        assert exits == [] and state_of(db, "j") == "completed" and failed == [name]
    finally:
        worker._stop("test over")
        thread.join(WAIT_S)
        worker.store.close()
    assert exits == [0]


@pytest.mark.parametrize("reason", ["timeout", "canceled"])
def test_a_runners_kill_path_never_waits_on_the_database(store, reason):
    """A timeout or a cancel kills with the settings the run started with: a config read that hangs
    (a server that stopped answering) must not hold the kill up, nor the cut-off kill behind it."""
    register(store)
    store.enqueue([spec("j", command="sleep 30", timeout=1.5 if reason == "timeout" else 0)], T0)
    real_config_all, reads, release = store.config_all, [], threading.Event()

    def config_all():
        reads.append(time.monotonic())
        if len(reads) > 1:  # the read at the start of the run answers; later ones hang
            release.wait(WAIT_S)
        return real_config_all()
    store.config_all = config_all
    started = time.monotonic()

    def abort(job, registration):
        return "canceled" if reason == "canceled" and time.monotonic() - started > 1.5 else None
    runner = queuectl.Runner(store, "w1", abort)
    real_run, ended = runner._run_command, []
    runner.execute = lambda *args: ended.append(real_run(*args)) or ended[0]
    running = threading.Thread(target=runner.run_once, args=(T0,), daemon=True)
    running.start()
    try:
        wait_for(lambda: ended, "the job to be killed", timeout=15)
    finally:
        release.set()  # the result is written with settings read again: that may wait
        running.join(WAIT_S)
    assert ended[0].error == ("timed out after 1.5s (terminated)" if reason == "timeout" else "canceled (terminated)")


@pytest.mark.parametrize("late", ["claim", "config_all"])
def test_a_job_whose_claim_or_settings_answer_after_the_cut_off_never_starts(store, monkeypatch, tmp_path, late):
    """The claim, or the settings read before the start, answers only after the worker was cut off from
    the database (a server that hung meanwhile): a sweeper elsewhere may be rerunning the job by then, so
    its process must not start, not even for the moment until the first look at abort(). The run is
    recorded as lost, as a run the cut-off killed."""
    register(store)
    store.enqueue([spec("j", command=f"touch {tmp_path / 'started'}")], T0)
    cut, real = threading.Event(), getattr(store, late)

    def answers_late(*args):
        answer = real(*args)
        cut.set()  # the worker was cut off while it waited for this answer
        return answer
    monkeypatch.setattr(store, late, answers_late)
    spawned, real_spawn = [], queuectl._spawn
    monkeypatch.setattr(queuectl, "_spawn", lambda *args: spawned.append(args[0].id) or real_spawn(*args))
    runner = queuectl.Runner(store, "w1", lambda job, registration: queuectl.CUT_OFF if cut.is_set() else None)
    assert runner.run_once(T0) is True
    assert spawned == [] and not (tmp_path / "started").exists()
    job = store.get("j")
    assert (job.state, job.lost_count) == ("pending", 1)
    assert [(r["outcome"], r["error"]) for r in store.runs("j")] == [("lost", queuectl.CUT_OFF)]


def test_postgres_the_cut_off_line_does_not_count_a_start_that_waits_on_the_database(pg_url, caplog):
    """A runner whose settings read before a start hangs (the server stopped answering) has no process
    running: the cut-off line counts it not (and once the read answers, nothing starts: see above)."""
    worker, release, running = queuectl.Worker(pg_url, 1, False), threading.Event(), None
    try:
        register(worker.store, worker.worker_id)
        worker.store.enqueue([spec("j", command="true")], worker.store.now())
        runner = worker._new_runner()
        real, reads = runner.store.config_all, []

        def hangs():
            reads.append(1)
            release.wait(WAIT_S)
            return real()
        runner.store.config_all = hangs
        running = threading.Thread(target=runner.run_once, daemon=True)
        running.start()
        wait_for(lambda: reads, "the runner to read the settings before the start")
        worker.stale_s, worker.beat_ok_at = 4.0, time.monotonic() - 3.0
        with caplog.at_level("ERROR", logger="queuectl"):
            worker._note_cut_off()
        lines = [r.getMessage() for r in caplog.records if "no heartbeat" in r.getMessage()]
        assert len(lines) == 1 and "killing 0 running job(s)" in lines[0], lines
    finally:
        release.set()
        if running:
            running.join(WAIT_S)
        for runner in worker.runners:
            runner.store.close()
        worker.store.close()


def test_postgres_the_cut_off_line_counts_a_run_its_runner_killed_first(pg_url, caplog):
    """A runner looks at abort() every GRACE_STEP_S and may see the cut-off, kill its run and end it
    before the guard thread (scheduled late on a loaded machine) says so: the line still counts that run."""
    worker = queuectl.Worker(pg_url, 1, False)
    try:
        register(worker.store, worker.worker_id)
        worker.store.enqueue([spec("j", command="true")], worker.store.now())
        runner = worker._new_runner()
        job = worker.store.claim(worker.worker_id, worker.store.now())
        runner.current, runner.running = job, True
        worker.stale_s, worker.beat_ok_at = 4.0, time.monotonic() - 3.0
        assert worker.abort_reason(job, worker.registration) == queuectl.CUT_OFF
        runner.running = False  # killed and ended: only then does the guard get to run
        with caplog.at_level("ERROR", logger="queuectl"):
            worker._note_cut_off()
        lines = [r.getMessage() for r in caplog.records if "no heartbeat" in r.getMessage()]
        assert len(lines) == 1 and "killing 1 running job(s)" in lines[0], lines
    finally:
        for runner in worker.runners:
            runner.store.close()
        worker.store.close()


def test_postgres_a_job_timing_out_while_the_server_hangs_dies_before_another_host_reruns_it(
        pg_url, hosts, workers, hanging_pg, tmp_path):
    """The job's timeout falls due while host A's server hangs: the kill must not wait on it, and the
    cut-off kills the job (which ignores SIGTERM) by stale-timeout/2 + 1 s after A's last heartbeat, so
    host B's rerun never meets it (a `flock -n` probe). A says so when it happens, with the right count."""
    stale_s = 8.0  # heartbeats every 1.6 s: the cut-off comes 2.4-4 s after the hang, after the timeout
    ok(pg_url, "config", "set", "stale-timeout", str(stale_s))
    job = ('if [ -e first ]; then if flock -n lock true; then echo rerun >> runs; else echo overlap >> runs; fi; '
           'else touch first; exec flock lock sh -c "trap \'\' TERM; echo run >> runs; sleep 60"; fi')
    enqueue(pg_url, id="j", command=job, cwd=str(tmp_path), timeout=2)
    a = Host(workers, "host-a", hanging_pg.url(pg_url))
    wait_for(lambda: (tmp_path / "runs").exists(), "host A to run the job")
    hanging_pg.hang()  # at once: the job's timeout, 2 s after its start, falls due inside the outage
    hung_at = time.monotonic()
    token = f"{json.loads(ok(pg_url, 'show', 'j', '--json'))['runs'][0]['worker_id']}/1/j"
    b = hosts("host-b")
    wait_for(lambda: not _run_processes(token), "host A's run to be killed", timeout=4 * stale_s)
    dead_after_s = time.monotonic() - hung_at
    assert dead_after_s <= stale_s / 2 + 1, f"killed {dead_after_s:.1f} s after the hang"
    a.proc.wait_log("killing 1 running job(s)", timeout=stale_s / 2)  # said while the server still hangs
    wait_for(lambda: state_of(pg_url, "j") == "completed", "the rerun on host B", timeout=6 * stale_s)
    assert (tmp_path / "runs").read_text() == "run\nrerun\n"  # no overlap
    assert b.proc.popen.poll() is None
    hanging_pg.resume()


def test_postgres_a_hard_stop_exits_130_within_5s_while_the_server_hangs(pg_url, workers, hanging_pg, tmp_path):
    """SIGQUIT while the server hangs: the job dies at once and the worker exits 130 within HARD_STOP_S,
    though its main thread and runner wait on connections that never answer. The cut-off that falls due
    meanwhile is said when it happens, and counts no job: the hard stop killed it already."""
    ok(pg_url, "config", "set", "stale-timeout", "4")  # the cut-off comes 1.2-2 s after the hang
    enqueue(pg_url, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    pool = Workers(hanging_pg.url(pg_url), tmp_path)
    try:
        worker = pool.start()
        _wait_started(tmp_path)
        shell_pid = int((tmp_path / "sh.pid").read_text())
        hanging_pg.hang()
        worker.signal(signal.SIGQUIT)
        signaled = time.monotonic()
        code = worker.wait(timeout=30)
        exited_after_s = time.monotonic() - signaled
        assert code == 130, worker.log()
        assert exited_after_s <= queuectl.HARD_STOP_S + 1, f"exited {exited_after_s:.1f} s after SIGQUIT"
        assert pid_gone(shell_pid)
        log = worker.log()
        assert "killing 0 running job(s)" in log and "worker exited (130)" in log, log
        assert log.count("worker exited") == 1
    finally:
        hanging_pg.resume()
        pool.cleanup()
    (tmp_path / "release").touch()
    rescuer = workers.start("--burst")  # the run it could not record is crash recovery's
    assert rescuer.wait() == 0, rescuer.log()
    assert [r["outcome"] for r in get_job(pg_url, "run")["runs"]] == ["lost", "completed"]


def test_a_hard_stop_exits_130_within_5s_while_a_database_call_never_returns(db, workers, tmp_path):
    """Both backends: the worker's deregistering never returns (as a call to a server that hangs does
    not); SIGQUIT still ends it with 130 within HARD_STOP_S, and once."""
    start = ("import sys, time; sys.path.insert(0, sys.argv[1]); import queuectl; "
             "queuectl.Store.deregister = lambda self, worker_id: time.sleep(3600); "
             "queuectl.exit_now(queuectl.main(sys.argv[2:]))")
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    with open(tmp_path / "hung.stderr", "wb") as err:
        popen = subprocess.Popen([sys.executable, "-c", start, HERE, "--db", db, "worker", "start"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True, env=child_env(**{TAG_VAR: workers.tag}))
    worker = WorkerProc(popen, tmp_path / "hung.stderr")
    workers.procs.append(worker)
    _wait_started(tmp_path)
    worker.signal(signal.SIGQUIT)
    signaled = time.monotonic()
    assert worker.wait(timeout=30) == 130, worker.log()
    exited_after_s = time.monotonic() - signaled
    assert exited_after_s <= queuectl.HARD_STOP_S + 1, f"exited {exited_after_s:.1f} s after SIGQUIT"
    assert worker.log().count("worker exited (130)") == 1
    assert state_of(db, "run") == "pending"  # the killed run was recorded before the hung call


def test_a_hard_stop_kills_and_exits_130_while_stderr_blocks(db, workers, tmp_path):
    """Both backends: the worker's stderr is a pipe that nobody reads and that is full (a log reader that
    stopped, a terminal paused with Ctrl+S), so every log line blocks. SIGQUIT still kills the job at
    once and ends the worker with 130 within HARD_STOP_S (a moment more for the lines it could not write)."""
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    read_end, write_end = os.pipe()
    try:
        popen = subprocess.Popen([sys.executable, QUEUECTL, "--db", db, "worker", "start"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=write_end, start_new_session=True,
                                 env=child_env(**{TAG_VAR: workers.tag}))
        workers.others.append(popen)
        _wait_started(tmp_path)
        shell_pid = int((tmp_path / "sh.pid").read_text())
        os.set_blocking(write_end, False)
        for size in (4096, 1):  # fill the pipe to the last byte: the worker's next line blocks
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(write_end, b"x" * size)
        os.set_blocking(write_end, True)  # the worker's stderr is the same open pipe: it must block, not fail
        popen.send_signal(signal.SIGQUIT)
        signaled = time.monotonic()
        wait_for(lambda: pid_gone(shell_pid), "the job to be killed", timeout=queuectl.HARD_STOP_S)
        code = popen.wait(timeout=30)
        exited_after_s = time.monotonic() - signaled
        assert code == 130
        assert exited_after_s <= queuectl.HARD_STOP_S + 2, f"exited {exited_after_s:.1f} s after SIGQUIT"
    finally:
        os.close(write_end)
        os.close(read_end)


def test_a_hard_stop_whose_line_blocks_claims_nothing_more(db, monkeypatch):
    """SIGQUIT with a stderr that blocks: the hard stop is in force before its line is written, and so is
    the end of claiming. A runner that claimed on would start nothing (the hard stop aborts it before its
    start) and put the job back, at once, again and again until the process ends: a run row each round in the
    runs table; or, where its own line blocks, hold a job that crash recovery then counts as lost."""
    import logging
    worker, blocked = queuectl.Worker(db, 1, False), threading.Event()

    def warning(message, *args, **kwargs):
        if "killing running jobs" in message:
            blocked.wait(WAIT_S)  # the line's write blocks: a full pipe, a terminal paused with Ctrl+S
        logging.getLogger("queuectl").warning(message, *args, **kwargs)
    monkeypatch.setattr(queuectl.log, "warning", warning, raising=False)
    signaled = threading.Thread(target=worker.on_signal, args=(signal.SIGQUIT,), daemon=True)
    runner = threading.Thread(target=worker._thread_main, daemon=True)
    try:
        register(worker.store, worker.worker_id, worker.store.now())
        worker.store.enqueue([spec("j")], worker.store.now())
        signaled.start()
        wait_for(worker.hard.is_set, "the hard stop")
        runner.start()
        wait_for(lambda: not runner.is_alive() or worker.store.runs("j"), "the runner to end or to claim")
        assert worker.store.runs("j") == []
        assert not runner.is_alive()
        assert worker.store.get("j").state == "pending"
    finally:
        blocked.set()
        signaled.join(WAIT_S)
        runner.join(WAIT_S)
        for each in worker.runners:
            each.store.close()
        worker.store.close()


def test_a_hard_stop_waits_longer_only_for_its_adopted_runs_processes(tmp_path):
    """The guard ends a hard-stopped worker HARD_STOP_S after the signal, or HARD_STOP_S later if it
    had adopted runs whose killed processes it waits for before leaving (see _finish_recoveries)."""
    worker = queuectl.Worker(str(tmp_path / "s.db"), 1, False)
    try:
        assert worker._exit_by() == math.inf  # no hard stop
        worker.hard_at = 100.0
        worker.hard.set()
        assert worker._exit_by() == 100.0 + queuectl.HARD_STOP_S
        worker.sweeper = queuectl.Sweeper(worker.store, worker.me, worker.worker_id)
        worker.sweeper.recovering[("j", 1)] = ("w/1/j", queuectl.Leftovers())
        assert worker._exit_by() == 100.0 + 2 * queuectl.HARD_STOP_S
        worker.sweeper.recovering.clear()  # requeued: its deregistering still gets that time
        assert worker._exit_by() == 100.0 + 2 * queuectl.HARD_STOP_S
    finally:
        worker.store.close()


def test_a_database_that_fails_in_the_start_up_sweep_does_not_stop_the_worker(db, monkeypatch):
    _runs_a_job_after_a_first_failure(db, monkeypatch, queuectl.Sweeper, "sweep")


def test_postgres_a_connection_that_fails_at_the_first_listen_does_not_stop_the_worker(pg_url, monkeypatch):
    _runs_a_job_after_a_first_failure(pg_url, monkeypatch, queuectl.PostgresStore, "wait_notified")


# ---- several hosts on one PostgreSQL queue -------------------------------------------------------

def test_a_job_of_a_killed_host_reruns_on_another_host_once_the_old_run_is_gone(pg_url, hosts, tmp_path):
    """Host A is SIGKILLed mid-job (its processes die with it); host B judges A by its lease and
    reruns the job within stale-timeout plus a few seconds, and the rerun's `flock -n` finds the old
    run's lock free."""
    job = ('if [ -e first ]; then flock -n lock true && echo rerun >> runs; '
           'else touch first; exec flock lock sh -c "echo run >> runs; exec sleep 60"; fi')
    enqueue(pg_url, id="j", command=job, cwd=str(tmp_path), max_retries=1)
    a = hosts("host-a")
    wait_for(lambda: (tmp_path / "runs").exists(), "host A to run the job")
    b = hosts("host-b")
    b.proc.wait_log("worker started")
    killed_at = time.monotonic()
    os.kill(a.worker_pid(), signal.SIGKILL)
    wait_for(lambda: state_of(pg_url, "j") in ("completed", "dead"), "the rerun on host B", timeout=60)
    rerun_after_s = time.monotonic() - killed_at
    job = get_job(pg_url, "j")
    assert job["state"] == "completed", job  # dead would mean the rerun met the old run's lock
    assert (tmp_path / "runs").read_text() == "run\nrerun\n"
    runs = json.loads(ok(pg_url, "show", "j", "--json"))["runs"]
    assert [r["outcome"] for r in runs] == ["lost", "completed"]
    assert runs[0]["worker_id"].startswith("host-a:") and runs[1]["worker_id"].startswith("host-b:")
    print(f"rerun {rerun_after_s:.1f} s after the kill (stale-timeout 2 s)")


def test_a_frozen_host_loses_its_job_and_kills_its_stale_run_when_thawed(pg_url, hosts, tmp_path):
    """Host A is frozen (SIGSTOP) past its lease while its job runs: nothing can stop that job while A
    is frozen, so B reruns it; once thawed, A finds its registration gone, kills its stale run at
    once, and its late result is discarded."""
    job = 'echo run >> runs; if [ "$(wc -l < runs)" -ge 2 ]; then exit 0; fi; exec sleep 60'
    enqueue(pg_url, id="j", command=job, cwd=str(tmp_path))
    a = hosts("host-a")
    wait_for(lambda: (tmp_path / "runs").exists(), "host A to run the job")
    token = f"{json.loads(ok(pg_url, 'show', 'j', '--json'))['runs'][0]['worker_id']}/1/j"
    assert _run_processes(token)
    b = hosts("host-b")
    b.proc.wait_log("worker started")
    worker = a.worker_pid()
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_for(lambda: state_of(pg_url, "j") == "completed", "the rerun on host B", timeout=60)
        assert _run_processes(token), "A's run goes on while A is frozen"
    finally:
        os.kill(worker, signal.SIGCONT)
    wait_for(lambda: not _run_processes(token), "A to kill its stale run once thawed", timeout=30)
    a.proc.wait_log("presumed dead")
    job = get_job(pg_url, "j")
    assert job["state"] == "completed" and job["run_count"] == 2
    assert [r["outcome"] for r in json.loads(ok(pg_url, "show", "j", "--json"))["runs"]] == ["lost", "completed"]


# ---- worker logs: --quiet and --log-format json --------------------------------------------------

def run_log_demo(db, workers, *flags):
    """A burst worker with FLAGS over `ok` (completes) and `bad` (fails, then dies); returns its stderr."""
    ok(db, "config", "set", "backoff-base", "1")
    enqueue(db, id="ok", command="echo hi")
    enqueue(db, id="bad", command="exit 3", max_retries=2)
    worker = workers.start("--burst", *flags)
    assert worker.wait() == 0, worker.log()
    return worker.log()


def test_worker_default_log_lines_keep_their_text_format(db, workers):
    messages = [TEXT_LOG_LINE.match(line)[1] for line in run_log_demo(db, workers).splitlines()]
    assert messages[0].startswith("worker started: ") and messages[-1] == "worker exited (0)"
    assert "job ok claimed (attempt 1): echo hi" in messages
    assert any(re.fullmatch(r"job ok completed in \d+\.\d\ds", m) for m in messages), messages
    assert any(re.fullmatch(r"job bad failed \(exit code 3\); retry 2 in \d+s", m) for m in messages), messages


def test_worker_log_names_its_database_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    ok(str(tmp_path / "q.db"), "enqueue", '{"command": "true"}')
    result = subprocess.run([sys.executable, QUEUECTL, "--db", "q.db", "worker", "start", "--burst"], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT_S, env=child_env())
    assert result.returncode == 0 and f", db {tmp_path / 'q.db'}\n" in result.stderr, result.stderr


def test_worker_quiet_logs_only_starts_stops_failures_and_deaths(db, workers):
    log_text = run_log_demo(db, workers, "--quiet")
    messages = [TEXT_LOG_LINE.match(line)[1] for line in log_text.splitlines()]
    assert messages[0].startswith("worker started: ") and messages[-1] == "worker exited (0)"
    assert any(m.startswith("job bad failed (exit code 3)") for m in messages), messages
    assert any(m.startswith("job bad dead after") for m in messages), messages
    assert any(m.startswith("stopping (burst: queue drained)") for m in messages), messages
    assert not any("claimed" in m or "completed" in m for m in messages), messages
    assert state_of(db, "ok") == "completed"  # quiet is only quiet: the job ran


def test_worker_log_format_json_writes_one_object_a_line(db, workers):
    lines = [json.loads(line) for line in run_log_demo(db, workers, "--log-format", "json").splitlines()]
    for line in lines:
        assert ISO_UTC.match(line["ts"]) and line["level"] in ("info", "warning", "error"), line
        assert isinstance(line["pid"], int) and line["message"], line
    events = [line["event"] for line in lines]
    assert events[0] == "worker_started" and events[-2:] == ["worker_stopping", "worker_exited"], events
    by_event = {(line["event"], line.get("job_id"), line.get("attempt")): line for line in lines}
    assert by_event["job_claimed", "ok", 1]["command"] == "echo hi"
    done = by_event["job_completed", "ok", 1]
    assert (done["exit_code"], done["error"]) == (0, None) and done["duration_s"] >= 0
    failed = by_event["job_failed", "bad", 1]
    assert (failed["exit_code"], failed["error"]) == (3, "exit code 3") and failed["retry_in_s"] >= 0
    dead = by_event["job_dead", "bad", 2]
    assert (dead["exit_code"], dead["error"]) == (3, "exit code 3")
    assert lines[-1]["exit_code"] == 0 and lines[0]["worker_id"] == lines[-1]["worker_id"]


def test_worker_quiet_json_leaves_out_the_routine_events(db, workers):
    events = [json.loads(line)["event"]
              for line in run_log_demo(db, workers, "-q", "--log-format", "json").splitlines()]
    assert "job_failed" in events and "job_dead" in events and "worker_exited" in events
    assert "job_claimed" not in events and "job_completed" not in events


def test_a_quiet_worker_builds_nothing_for_the_lines_it_does_not_write(store, monkeypatch, caplog):
    register(store)
    store.enqueue([spec("a"), spec("b")], T0)
    runner = queuectl.Runner(store, "w1", lambda job, registration: None)
    runner.execute = lambda job, env, abort, on_output: outcome(0)

    def must_not_run(*args, **kwargs):
        raise AssertionError("formatting work for a line that is not written")
    for name in ("_short", "_run_event"):
        monkeypatch.setattr(queuectl, name, must_not_run)
    monkeypatch.setattr(queuectl.log, "quiet", True)
    with caplog.at_level("INFO", logger="queuectl"):
        assert runner.run_once(now=T0)
    assert caplog.records == [] and store.get("a").state == "completed"
    monkeypatch.undo()  # the same step, not quiet: the lines and their events are there
    with caplog.at_level("INFO", logger="queuectl"):
        assert runner.run_once(now=T0)
    assert [r.event for r in caplog.records] == ["job_claimed", "job_completed"]
    assert caplog.records[1].fields == {"job_id": "b", "attempt": 1, "exit_code": 0, "error": None,
                                        "duration_s": 0.01}


def test_routine_lines_written_past_logging_are_the_bytes_logging_writes(monkeypatch):
    """The text format writes a job's claimed and completed lines without a log record (RoutineLines):
    byte for byte what its handler writes for a record of the same message, time and process, escapes
    included, and through the handler's stream, so the two kinds never interleave."""
    import logging
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(queuectl.TextLines(logging.Formatter()))
    monkeypatch.setattr(queuectl.time, "time", lambda: T0 + 0.2168)
    message = f"job {TERMINAL_HOSTILE} claimed (attempt 1): x"
    queuectl.RoutineLines(handler).write(message)
    handler.emit(logging.makeLogRecord({"msg": message, "created": T0 + 0.2168, "process": os.getpid()}))
    direct, logged = stream.getvalue().splitlines(keepends=True)
    assert direct == logged == f"2027-01-15T08:00:00.216Z queuectl[{os.getpid()}]: job {TERMINAL_SHOWN} claimed (attempt 1): x\n"


def test_text_log_time_is_iso_to_the_millisecond_rounded_as_datetime_rounds_it():
    """TextLines formats a line's date and time once a second (stamp_of): every instant reads as iso()
    reads it, at a second's edges too, where datetime's rounding to microseconds carries into the next."""
    edges = [0.0, 1.9995, 1.9999996, 1.0000004, 1_764_678_888.0, 1_764_678_888.9994999, 1_764_678_888.99999951]
    instants = edges + [1_764_678_888 + n / 997 for n in range(3000)] + [T0 - n / 3 for n in range(3000)]
    for t in instants:
        assert queuectl.TextLines.stamp_of(t) == queuectl.iso(t), t


def test_routine_lines_a_write_that_fails_is_handled_as_logging_handles_it(monkeypatch):
    """A full disk that frees up again: the line that failed stays in the stream's buffer and is written
    once, as logging leaves it (not a second time through logging), and the handler's handleError gets it."""
    import errno
    import logging

    class FullOnce(io.RawIOBase):
        def __init__(self):
            self.full, self.out = True, bytearray()

        def writable(self):
            return True

        def write(self, data):
            if self.full:
                self.full = False
                raise OSError(errno.ENOSPC, "No space left on device")
            self.out += data
            return len(data)

    def written(past_logging: bool):
        raw, reported = FullOnce(), []
        handler = logging.StreamHandler(io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True))
        handler.setFormatter(queuectl.TextLines(logging.Formatter()))
        monkeypatch.setattr(handler, "handleError", lambda record: reported.append(record.getMessage()))
        monkeypatch.setattr(logging.getLogger(), "handlers", [handler])  # a worker's logging: this handler alone
        monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
        for message in ("job a completed in 0.01s", "job b completed in 0.01s"):
            if past_logging:
                queuectl.RoutineLines(handler).write(message)  # no exception reaches the runner
            else:
                handler.handle(logging.makeLogRecord({"msg": message, "created": T0, "process": os.getpid()}))
        return raw.out.decode(), reported
    monkeypatch.setattr(queuectl.time, "time", lambda: T0)
    assert written(past_logging=True) == written(past_logging=False) == (
        "".join(f"2027-01-15T08:00:00.000Z queuectl[{os.getpid()}]: job {j} completed in 0.01s\n" for j in "ab"),
        ["job a completed in 0.01s"])


def test_routine_lines_go_through_logging_when_it_is_set_up_after_the_worker_started(monkeypatch):
    """A handler added after configure_logging (a test harness, a program running main() in a thread) sees a
    job's routine lines with their events, and a level set on the queuectl logger leaves them out, as for
    any other line: RoutineLines writes them only while logging would write them through its handler alone."""
    import argparse
    import logging
    root, logger = logging.getLogger(), logging.getLogger("queuectl")
    monkeypatch.setattr(queuectl.log, "lines", None)
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "handlers", [])
    queuectl.configure_logging(argparse.Namespace(quiet=False, log_format="text"))
    stream, seen = io.StringIO(), []
    monkeypatch.setattr(root.handlers[0], "stream", stream)

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append((record.getMessage(), record.event))
    root.addHandler(Seen())
    queuectl.log.routine("job %s completed in %.2fs", ("a", 0.01), lambda: queuectl.event("job_completed"))
    assert seen == [("job a completed in 0.01s", "job_completed")]
    assert stream.getvalue().count("job a completed") == 1  # and the worker's own handler wrote it once
    del root.handlers[1:]
    monkeypatch.setattr(logger, "level", logging.WARNING)
    monkeypatch.setattr(logger, "_cache", {})  # what setLevel clears
    queuectl.log.routine("job %s completed in %.2fs", ("b", 0.01), lambda: queuectl.event("job_completed"))
    assert "job b" not in stream.getvalue()


def test_routine_lines_skip_logging_only_where_its_handler_is_the_only_one(monkeypatch):
    """configure_logging writes the routine lines itself only where logging would write them through the
    one handler it installed: not with --log-format json, nor where logging was set up before (pytest's
    capture, a program that calls main()), whose handlers must see every record."""
    import argparse
    import logging
    root = logging.getLogger()
    monkeypatch.setattr(queuectl.log, "lines", None)
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])  # set up before, as pytest's capture is
    queuectl.configure_logging(argparse.Namespace(quiet=False, log_format="text"))
    assert queuectl.log.lines is None
    root.handlers = []
    queuectl.configure_logging(argparse.Namespace(quiet=False, log_format="text"))
    assert isinstance(queuectl.log.lines, queuectl.RoutineLines) and root.handlers == [queuectl.log.lines.handler]
    root.handlers = []
    queuectl.configure_logging(argparse.Namespace(quiet=False, log_format="json"))
    assert queuectl.log.lines is None


def test_json_log_lines_carry_tracebacks_and_other_libraries_lines_on_one_line():
    import logging
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = logging.makeLogRecord({"msg": "job %s: internal error", "args": ("x",), "levelname": "ERROR",
                                        "exc_info": sys.exc_info(), "created": T0, "process": 7,
                                        **queuectl.event("job_internal_error", job_id="x")})
    text = queuectl.JsonLines().format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert (line["ts"], line["level"], line["event"], line["job_id"]) == ("2027-01-15T08:00:00.000Z", "error",
                                                                          "job_internal_error", "x")
    assert line["message"] == "job x: internal error" and "ValueError: bad\nthing" in line["traceback"]
    other = json.loads(queuectl.JsonLines().format(logging.makeLogRecord({"msg": "from psycopg", "created": T0})))
    assert other["event"] == "log" and other["message"] == "from psycopg"


@sqlite_only
def test_worker_start_help_shows_the_log_options_and_refuses_a_bad_format(db):
    code, out, _ = cli(db, "worker", "start", "--help")
    assert code == 0 and "--quiet" in out and "--log-format {text,json}" in out
    code, _, err = cli(db, "worker", "start", "--log-format", "xml")
    assert_argparse_error(code, err)
    assert not os.path.exists(db)


def test_a_json_logging_worker_writes_its_note_about_an_empty_queue_as_json(db, workers):
    enqueue(db, id="ok", command="true", queue="a")
    worker = workers.start("--burst", "--queue", "a", "--queue", "b", "--log-format", "json")
    assert worker.wait() == 0
    lines = [json.loads(line) for line in worker.log().splitlines()]  # every line, the note included
    note = next(line for line in lines if line["event"] == "queue_has_no_jobs")
    assert note["queues"] == ["b"] and note["level"] == "warning" and "'b' has no jobs yet" in note["message"]


# ---- worker list ---------------------------------------------------------------------------------

def test_worker_list_without_workers(db):
    assert json.loads(ok(db, "worker", "list", "--json")) == []
    assert cli(db, "worker", "list")[0] == 0


def test_worker_list_shows_a_registered_worker_and_its_jobs(db):
    claim_for_a_fake_worker(db, "run")
    rows = json.loads(ok(db, "worker", "list", "--json"))
    assert len(rows) == 1
    row = rows[0]
    assert {"id", "host", "pid", "started_at", "heartbeat_at", "threads", "jobs"} <= row.keys()
    assert (row["id"], row["host"], row["pid"], row["threads"], row["jobs"]) == ("fake", "h", 1, 1, ["run"])
    parse_iso(row["started_at"])
    parse_iso(row["heartbeat_at"])
    text = ok(db, "worker", "list")
    assert "fake" in text and "run" in text
    header, line = text.splitlines()[:2]
    assert "HOST" in header and "STARTED" in header
    assert " h " in line and row["started_at"] in line


def test_worker_list_shows_a_running_worker_and_its_job(db, workers, tmp_path):
    enqueue(db, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start("--count", "2")
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    rows = json.loads(ok_when_free(db, "worker", "list", "--json"))
    assert len(rows) == 1
    row = rows[0]
    assert {"id", "host", "pid", "started_at", "heartbeat_at", "threads", "jobs"} <= row.keys()
    assert (row["pid"], row["host"], row["threads"], row["jobs"]) == \
        (worker.popen.pid, socket.gethostname(), 2, ["long"])
    assert row["id"] in worker.log()
    assert parse_iso(row["started_at"]) <= parse_iso(row["heartbeat_at"])
    assert abs(parse_iso(row["heartbeat_at"]).timestamp() - time.time()) < WAIT_S
    text = ok_when_free(db, "worker", "list")
    assert row["id"] in text and "long" in text and str(worker.popen.pid) in text
    (tmp_path / "release").touch()
    assert script(db, "worker", "stop").returncode == 0
    assert worker.wait() == 0, worker.log()
    assert json.loads(ok(db, "worker", "list", "--json")) == []


def test_workers_say_which_queues_they_serve(db, workers):
    enqueue(db, id="bad", command="exit 3", max_retries=0, queue="a")
    worker = workers.start("--burst", "--queue", "a", "--queue", "b")
    assert worker.wait() == 0
    log = worker.log()
    assert "queuectl: note: queue 'b' has no jobs yet" in log
    assert re.search(r"worker started: \S+, 1 thread\(s\), queues a, b, db ", log), log
    assert "job bad dead after 1 attempt: exit code 3" in log
    with opened(db) as s:
        s.register("some", queuectl.host_identity(), 1, s.now(), ("x",))
        s.register("every", queuectl.host_identity(), 1, s.now())
    listed = {w["id"]: (w["queues"], w["version"]) for w in json.loads(ok(db, "worker", "list", "--json"))}
    assert listed == {"some": (["x"], queuectl.__version__), "every": (None, queuectl.__version__)}
    table = ok(db, "worker", "list")
    assert "QUEUES" in table and " (all) " in table
    assert " VERSION " in table and f" {queuectl.__version__} " in table


# ==== The worker process ==========================================================================

@contextlib.contextmanager
def pg_tables_locked(pg_url):
    """Another session holds queuectl's tables locked against every write (LOCK TABLE … EXCLUSIVE)."""
    import psycopg
    from urllib.parse import parse_qsl, urlsplit
    parts = urlsplit(pg_url)
    schema = dict(parse_qsl(parts.query))["schema"]
    with psycopg.connect(parts._replace(query="").geturl(), connect_timeout=30) as conn:
        conn.execute(f'LOCK TABLE "{schema}".jobs, "{schema}".runs, "{schema}".workers IN EXCLUSIVE MODE')
        yield
        conn.rollback()


def _two_sigterms_as_soon_as_delivered(db, workers, tmp_path, locked):
    """Two SIGTERMs, the second sent as soon as the first was delivered (not handled): a hard stop."""
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    _wait_started(tmp_path)
    with write_locked(db) if locked else contextlib.nullcontext():
        for _ in range(2):
            worker.signal(signal.SIGTERM)
            wait_for(lambda: worker.popen.poll() is not None or not _signal_pending(worker.popen.pid, signal.SIGTERM),
                     "the signal to be delivered")
        assert worker.wait(timeout=30) == 130, worker.log()
    assert not (tmp_path / "release").exists()


def has_open(pid, db):
    """Whether process pid holds its database open: a command that has opened it is past start-up. An
    SQLite file shows among its open files; a PostgreSQL connection as its one socket."""
    fd_dir = f"/proc/{pid}/fd"
    opened = (lambda link: link.startswith("socket:")) if is_pg(db) else os.path.realpath(db).__eq__
    with contextlib.suppress(OSError):
        return any(opened(os.readlink(os.path.join(fd_dir, fd))) for fd in os.listdir(fd_dir))
    return False


def test_worker_stop_with_no_workers(db):
    code, out, err = cli(db, "worker", "stop")
    assert code == 0, err
    assert out == "asked 0 workers to stop\n"


def test_worker_stop_timeout_without_wait_exits_2_and_asks_no_worker(db):
    claim_for_a_fake_worker(db, "run")
    code, out, err = cli(db, "worker", "stop", "--timeout", "5")
    assert (code, out) == (2, "")
    assert_one_error(err, "--timeout", "--wait")
    assert [w["stopping"] for w in json.loads(ok(db, "worker", "list", "--json"))] == [False]


def test_worker_stop_makes_a_running_worker_exit(db, workers):
    ok(db, "config", "set", "stale-timeout", "1")  # a worker reads the request at its heartbeat: every 0.2 s
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
    ok(db, "config", "set", "stale-timeout", "1")  # a worker reads the request at its heartbeat: every 0.2 s
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
    ok(db, "config", "set", "stale-timeout", "1")  # a worker reads the request at its heartbeat: every 0.2 s
    worker = workers.start()
    worker.wait_log("worker started")
    result = script(db, "worker", "stop", "--wait", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    assert worker.wait() == 0, worker.log()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_first_signal_lets_the_running_job_finish(db, workers, tmp_path, sig):
    """SIGHUP too: closing the terminal a worker runs in must not kill it with its jobs left running."""
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start("--count", "2")
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    worker.signal(sig)
    worker.wait_log("stopping (SIGHUP" if sig == signal.SIGHUP else "stopping (signal)")
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
    # Wait until the first signal was handled: two identical standard signals sent back to back merge
    # into one delivery while the first is still pending, and the worker would see only one.
    worker.wait_log("stopping")
    worker.signal(sig)
    assert worker.wait() == 130, worker.log()
    job = get_job(db, "run")
    assert (job["state"], job["attempts"]) == ("pending", 0)
    wait_for(lambda: pid_gone(shell_pid), "the job's shell to be killed", timeout=10)
    assert not (tmp_path / "release").exists()


def test_a_second_sighup_is_no_hard_stop(db, workers, tmp_path):
    """A closed terminal sends SIGHUP twice, as a rule: its shell passes its own on to its jobs, and the kernel
    sends one more to the foreground job when that shell exits. The worker still finishes its job and exits 0."""
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    worker.wait_log("worker started")
    _wait_started(tmp_path)
    worker.signal(signal.SIGHUP)
    worker.wait_log("stopping (SIGHUP")  # handled: the second is a delivery of its own (see the test above)
    worker.signal(signal.SIGHUP)
    wait_for(lambda: not _signal_pending(worker.popen.pid, signal.SIGHUP), "the second SIGHUP to be delivered")
    deadline = time.monotonic() + 1.0  # a hard stop would follow its delivery at once: watch for a moment
    while time.monotonic() < deadline:
        assert "second signal" not in worker.log() and worker.popen.poll() is None, worker.log()
        time.sleep(0.05)
    (tmp_path / "release").touch()
    assert worker.wait() == 0, worker.log()
    assert get_job(db, "run")["state"] == "completed"


def test_a_worker_started_with_sighup_ignored_keeps_it_ignored(db, workers, tmp_path):
    """`nohup queuectl worker start &`: the user asked for a worker that outlives its terminal."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited by the worker, as nohup does it
    try:
        worker = workers.start()
    finally:
        signal.signal(signal.SIGHUP, previous)
    worker.wait_log("worker started")
    worker.signal(signal.SIGHUP)
    enqueue(db, id="after", command="true", cwd=str(tmp_path))
    worker.wait_log("job after completed")
    assert "stopping" not in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_postgres_locked_tables_end_in_busy_and_a_hard_stop_still_stops(pg_url, pg_workers, tmp_path):
    """A statement waits for a lock no longer than SQLite's busy wait: a command gives up with
    "database is busy" (exit 1), and a hard-stopped worker exits 130 within seconds."""
    enqueue(pg_url, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = pg_workers.start()
    _wait_started(tmp_path)
    with pg_tables_locked(pg_url):
        result = script(pg_url, "enqueue", '{"id": "blocked", "command": "true"}', timeout=60)
        assert result.returncode == 1, result.stderr
        assert_one_error(result.stderr, "database is busy")
        worker.signal(signal.SIGTERM)
        worker.wait_log("stopping")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 130, worker.log()
    assert [j["id"] for j in json.loads(ok(pg_url, "list", "--json"))] == ["run"]  # nothing half-stored


def test_a_hard_stop_exits_130_while_the_database_cannot_be_written(sqlite_db, workers, tmp_path):
    """The results cannot be written: a hard stop still ends the worker within seconds, and the
    unrecorded run is left to crash recovery."""
    enqueue(sqlite_db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    _wait_started(tmp_path)
    shell_pid = int((tmp_path / "sh.pid").read_text())
    with write_locked(sqlite_db):
        worker.signal(signal.SIGTERM)
        worker.wait_log("stopping")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 130, worker.log()  # HARD_STOP_S is 5 s
        wait_for(lambda: pid_gone(shell_pid), "the job's shell to be killed", timeout=10)
    rescuer = workers.start("--burst")
    (tmp_path / "release").touch()
    assert rescuer.wait() == 0, rescuer.log()
    assert get_job(sqlite_db, "run")["state"] == "completed"


def test_a_hard_stop_still_records_what_it_can_write_in_time(sqlite_db, workers, tmp_path):
    """The database is locked for a moment when the hard stop comes: the worker keeps trying for most
    of its 5 s, so the killed run is recorded as stopped, not left to crash recovery as lost."""
    enqueue(sqlite_db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    _wait_started(tmp_path)
    shell_pid = int((tmp_path / "sh.pid").read_text())
    with write_locked(sqlite_db):
        worker.signal(signal.SIGQUIT)
        wait_for(lambda: pid_gone(shell_pid), "the job's shell to be killed", timeout=10)
        time.sleep(1.5)  # on purpose: the lock outlasts the worker's first busy wait (1 s)
    assert worker.wait() == 130, worker.log()
    job = get_job(sqlite_db, "run")
    assert (job["state"], job["lost_count"]) == ("pending", 0)
    assert json.loads(ok(sqlite_db, "show", "run", "--json"))["runs"][0]["outcome"] == "stopped"


def test_every_delivered_signal_counts(db, workers, tmp_path):
    _two_sigterms_as_soon_as_delivered(db, workers, tmp_path, locked=False)


def test_every_delivered_signal_counts_while_the_database_is_locked(sqlite_db, workers, tmp_path):
    """... even while the main thread is blocked in SQLite, where Python runs no handler."""
    _two_sigterms_as_soon_as_delivered(sqlite_db, workers, tmp_path, locked=True)


def test_sigquit_is_a_hard_stop(db, workers, tmp_path):
    enqueue(db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    worker = workers.start()
    _wait_started(tmp_path)
    shell_pid = int((tmp_path / "sh.pid").read_text())
    worker.signal(signal.SIGQUIT)
    assert worker.wait() == 130, worker.log()
    assert "SIGQUIT: killing running jobs" in worker.log()
    job = get_job(db, "run")
    assert (job["state"], job["attempts"]) == ("pending", 0)
    wait_for(lambda: pid_gone(shell_pid), "the job's shell to be killed", timeout=10)


def test_commands_that_wait_on_the_user_exit_130_on_ctrl_c(db, workers):
    enqueue(db, id="later", command="true")  # no worker: never runs, so nothing they wait for happens
    procs = {args: workers.spawn(*args) for args in (("status", "--watch"), ("logs", "later", "--follow"),
                                                      ("wait", "later"))}
    for args, proc in procs.items():
        wait_for(lambda: has_open(proc.pid, db), f"{args} to open the database")
        proc.send_signal(signal.SIGINT)
    for args, proc in procs.items():
        assert proc.wait(timeout=WAIT_S) == 130, args
        err = proc.stderr.read().decode()
        assert "Traceback" not in err and "error" not in err, (args, err)


def test_worker_stop_signals_nothing(db):
    """`worker stop` writes a flag; even a live-looking row with a stranger's PID gets no signal."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        s = queuectl.open_database(db)
        me = queuectl.host_identity()
        s.register("looks-alive", {**me, "pid": bystander.pid, "proc_start": queuectl.proc_start_time(bystander.pid)},
                   1, time.time())
        s.close()
        assert ok(db, "worker", "stop") == "asked 1 worker to stop\n"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_write_after_a_hard_stop_gave_up_tries_once_without_sqlites_busy_wait(sqlite_db, monkeypatch):
    """A hard stop gives up on writes it cannot make in time. Runner threads write in turns, and each
    one's first try after that point sat out SQLite's busy wait (a second) before it saw that the stop
    had given up: with another process holding the database, a worker with 8 runners exited 13 s after
    SIGQUIT, not the 5 s promised. Past that point a write gets one try that does not wait."""
    monkeypatch.setattr(queuectl, "BUSY_TIMEOUT_S", 3600.0)  # a try that waits outlasts the test
    store = queuectl.SqliteStore(sqlite_db, give_up=lambda: True, busy_deadline_s=3600.0)  # (it bounds the wait too)
    holder = hold_write_lock(sqlite_db)
    errors = []

    def write():
        try:
            store.write(lambda cur: cur.execute("DELETE FROM jobs"))
        except queuectl.Busy as e:
            errors.append(e)
    writing = threading.Thread(target=write, daemon=True)
    writing.start()
    writing.join(WAIT_S)
    gave_up = not writing.is_alive()
    holder.stdin.close()
    holder.wait()
    writing.join(WAIT_S)
    store.close()
    assert gave_up and len(errors) == 1


# ==== Dashboard ===================================================================================

@pytest.fixture
def sqlite_dashboard(sqlite_db):
    """Dashboards on a seeded queue in an SQLite file, for what only SQLite shows (PRAGMA data_version)."""
    with dashboards(sqlite_db) as start:
        yield start


def cli_json(capsys, path, *args):
    """The JSON a CLI command prints with --json."""
    capsys.readouterr()
    assert queuectl.main(["--db", path, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def quote_id(job_id):
    """A job id as one path segment (a '/' in it too)."""
    from urllib.parse import quote
    return quote(job_id, safe="")


def raw_http(d, data):
    """Send raw bytes to the dashboard; the start of its answer."""
    import socket
    with socket.create_connection(d.server.server_address[:2], timeout=30) as sock:
        sock.sendall(data)
        return sock.recv(200)


def job_states(d):
    """Job id -> state, read straight from the store."""
    return {job.id: job.state for job in d.store.list_jobs()}


def start_dashboard_process(db, *args, **popen_args):
    """`queuectl --db DB dashboard --port 0 ARGS` as a process; returns it and the URL it printed."""
    proc = subprocess.Popen([sys.executable, queuectl.__file__, "--db", db, "dashboard", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_args)
    return proc, proc.stdout.readline().strip()


def stop_dashboard_process(proc, sig):
    """Send sig; the exit code and stderr once it has exited."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, err


def chromium_dom(url, tmp_path, *flags):
    """The DOM of url after the page's scripts ran (headless Chromium, virtual time; more flags given)."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing; CI must run the browser test (apt-get install chromium)")
        pytest.skip(f"browser test skipped: {CHROMIUM} not found (apt-get install chromium, or set QUEUECTL_CHROMIUM)")
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000",
                           *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "</html>" in proc.stdout, proc.stderr[-3000:]
    return proc.stdout


def recorded_requests(d, monkeypatch):
    """A list that gets (target, headers) of every request the dashboard d answers from now on."""
    asked, respond = [], d.dashboard.respond
    monkeypatch.setattr(d.dashboard, "respond", lambda method, target, headers: asked.append(
        (target, dict(headers))) or respond(method, target, headers))
    return asked


def neighbour_server(page, answer):
    """Another local user's web server on a free loopback port (the machine's other sites): GET / is
    `page`, any other path gets answer(path); it records (path, headers) of every request. Stop it with
    .shutdown()."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            server.asked.append((self.path, dict(self.headers)))
            body = page if self.path == "/" else answer(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body.encode())))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.asked, server.base = [], f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def cpu_share(pid, seconds):
    """The share of one core that pid used over the next `seconds` of wall time."""
    start, used = time.monotonic(), cpu_seconds(pid)
    wait_for(lambda: time.monotonic() - start >= seconds, f"{seconds} s to pass", interval=0.2)
    return (cpu_seconds(pid) - used) / (time.monotonic() - start)


def hold_half_open_connections(pid, address, count, settled):
    """Open `count` connections to the server pid that each send half a request and wait, a few at a
    time beyond those the server has taken or closed (a handshake that finds its listen queue full is
    retried only a second or more later); returns their sockets once `settled(closed)` holds for the
    number the server has closed, or after WAIT_S in any case."""
    import selectors
    held, selector, closed, base = [], selectors.DefaultSelector(), 0, open_files(pid)
    deadline = time.monotonic() + WAIT_S
    while not settled(closed) and time.monotonic() < deadline:
        queued = len(held) - closed - (open_files(pid) - base)  # opened, not yet taken by the server
        for _ in range(min(4 - queued, count - len(held))):
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.setblocking(False)
            conn.connect_ex(address)
            held.append(conn)
            selector.register(conn, selectors.EVENT_WRITE)
        for key, events in selector.select(timeout=0.01):
            conn = key.fileobj
            try:
                if events & selectors.EVENT_WRITE:  # connected: half a request, then wait for the server's end
                    conn.send(HALF_A_REQUEST)
                    selector.modify(conn, selectors.EVENT_READ)
                    continue
                ended = conn.recv(4096) == b""
            except OSError:
                ended = True
            if ended:
                closed += 1
                selector.unregister(conn)
    selector.close()
    return held


def request_threads():
    """The connection threads of http.server's ThreadingMixIn alive in this process."""
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def add_big_jobs(d):
    """Jobs enough in dashboard `d`'s queue that a page of them is far more than a socket's buffers hold."""
    now, command = time.time(), "echo " + "x" * 100_000
    d.store.enqueue([queuectl.validate_job({"id": f"big-{i}", "command": command}, d.store.config_all(), "/tmp", now)
                     for i in range(100)], now)


def big_page_unread(d):
    """A connection to dashboard `d` (see add_big_jobs) that asks for a page of jobs and reads only its
    status line: the rest of the reply waits on this client (the server's write of it blocks)."""
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect(): a small window
    conn.settimeout(WAIT_S)
    try:
        conn.connect(("127.0.0.1", d.server.server_address[1]))
        conn.sendall(f"GET /api/jobs?limit=1000 HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Queuectl-Token: {DASH_TOKEN}"
                     "\r\n\r\n".encode())
        head = b""
        while len(head) < 12 and (part := conn.recv(12 - len(head))):
            head += part
        assert head == b"HTTP/1.0 200", head
    except BaseException:
        conn.close()
        raise
    return conn


def request_status(d, path):
    """A request's status, or the error of a connection closed unanswered."""
    try:
        return d.request(path)[0]
    except OSError as e:
        return e


def add_truncated_run(store, job_id, kept, total):
    """A completed job whose run printed `total` bytes of which the last `kept` were kept."""
    now = store.now()
    spec_ = queuectl.validate_job({"id": job_id, "command": "yes", "queue": "cut"}, store.config_all(), "/tmp", now)
    store.enqueue([spec_], now)
    job = store.claim("dash-worker", now, ("cut",))
    assert job.id == job_id
    done = queuectl.Outcome(0, None, b"y\n" * (kept // 2), 0.5)
    done.output_bytes = total
    store.finish(job, "dash-worker", done, store.config_all(), now + 0.5)


def test_dashboard_of_a_queue_not_made_yet_shows_it_empty_and_creates_nothing(db, tmp_path):
    if is_pg(db):
        assert not pg_schema_exists(db)
    server = DashboardUnderTest(db)
    try:
        assert server.get("/api/status")["jobs"]["pending"] == 0 and server.get("/api/jobs") == []
        assert not (pg_schema_exists(db) if is_pg(db) else os.listdir(tmp_path))
        enqueue(db, id="later", command="true")
        assert server.get("/api/status")["jobs"]["pending"] == 1
    finally:
        server.close()


def test_dashboard_refuses_every_request_without_the_right_token(dashboard):
    d = dashboard()
    port = d.server.server_address[1]
    for path in ("/api/status", "/api/jobs", "/api/jobs/done-1", "/metrics", "/nope"):
        for headers in ({}, {"X-Queuectl-Token": "wrong"}, {"X-Queuectl-Token": ""},
                        {"Cookie": f"queuectl_token_{port}={DASH_TOKEN}"}):  # the cookie an older version set
            status, _, body = d.request(path, auth=None, headers=headers)
            assert status == 403 and "token" in body["error"], (path, headers, status, body)


def test_dashboard_takes_the_token_from_its_header_only_never_the_query_string(dashboard):
    d = dashboard()
    for path in ("/?token=" + DASH_TOKEN, "/api/status?token=" + DASH_TOKEN, "/api/status?token=wrong"):
        for auth in (None, "header"):
            status, _, body = d.request(path, auth=auth)
            assert status == 403 and "X-Queuectl-Token header, not the query string" in body["error"], (path, body)
    assert d.get("/api/status")["jobs"]["pending"] == 2


def test_dashboard_takes_a_bearer_token_as_prometheus_sends_it(dashboard):
    """Prometheus's `authorization` (and older scrapers, which have no custom headers) send the token as
    `Authorization: Bearer TOKEN`; a page of another site cannot set that header either."""
    d = dashboard(allow_actions=True)
    for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {DASH_TOKEN}"},
                    {"Authorization": "Bearer "}):
        assert d.request("/metrics", auth=None, headers=headers)[0] == 403, headers
    status, _, body = d.request("/metrics", auth=None, headers={"Authorization": f"Bearer {DASH_TOKEN}"})
    assert status == 200 and "queuectl_jobs" in body
    status, _, job = d.request("/api/jobs/img-1/cancel", method="POST", auth=None,
                               headers={"Authorization": f"bearer {DASH_TOKEN}"})
    assert status == 200 and job["state"] == "dead"


def test_dashboard_never_sets_a_cookie(dashboard):
    d = dashboard(allow_actions=True)
    printed = d.dashboard.url(d.server).removeprefix(d.base).partition("#")[0]  # what a browser asks for it
    for path, method, auth in ((printed, "GET", None), ("/", "GET", "header"), ("/api/status", "GET", "header"),
                               ("/api/status", "GET", None), ("/api/jobs/img-1/cancel", "POST", "header")):
        status, headers, _ = d.request(path, method=method, auth=auth)
        assert status in (200, 403) and headers.get_all("Set-Cookie") is None, (path, method, auth, status)
    assert d.store.get("img-1").state == "dead"  # the cancel went through: the loop saw answers of each kind


def test_dashboard_page_needs_no_token_and_holds_no_data_or_token(dashboard):
    d = dashboard()
    status, headers, page = d.request("/", auth=None)
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert DASH_TOKEN not in page and "img-1" not in page and "done-1" not in page
    assert '<meta name="queuectl-needs-token" content="1">' in page
    assert '<meta name="queuectl-needs-token" content="">' in dashboard(token=None).request("/", auth=None)[2]
    assert d.request("/", auth=None, headers={"Host": "evil.example"})[0] == 403  # the Host check still holds


def test_dashboard_without_a_token_serves_everyone_on_this_machine(dashboard):
    d = dashboard(token=None)
    assert d.get("/api/status", auth=None)["jobs"]["pending"] == 2


def test_dashboard_answers_only_to_loopback_host_names(dashboard):
    d = dashboard(token=None)  # DNS rebinding matters most without a token
    for host in ("localhost:1", "127.0.0.1:1", "[::1]:1", "127.0.0.2"):
        assert d.request("/api/status", auth=None, headers={"Host": host})[0] == 200, host
    for host in ("evil.example:80", "127.evil.example", "localhost.evil.example"):
        status, _, body = d.request("/api/status", auth=None, headers={"Host": host})
        assert status == 403 and "Host" in body["error"], host


def test_dashboard_api_shapes_equal_the_cli_json(dashboard, capsys):
    d = dashboard()
    assert d.get("/api/status") == cli_json(capsys, d.path, "status")
    assert d.get("/api/status?queue=images") == cli_json(capsys, d.path, "status", "--queue", "images")
    assert d.get("/api/jobs") == list(reversed(cli_json(capsys, d.path, "list")))
    for job_id in ("done-1", SCRIPT_ID, "running-1", "img-1"):
        assert d.get("/api/jobs/" + quote_id(job_id)) == cli_json(capsys, d.path, "show", job_id)
    api_stats, cli_stats = d.get("/api/stats"), cli_json(capsys, d.path, "stats")
    api_stats.pop("oldest_eligible_age_s"), cli_stats.pop("oldest_eligible_age_s")  # both read the clock
    assert api_stats == cli_stats
    assert api_stats["runs"] == {"completed": 1, "failed": 0, "dead": 1}
    assert d.get("/api/stats?since=1d")["window_s"] == 86400
    api_workers, cli_workers = d.get("/api/workers"), cli_json(capsys, d.path, "worker", "list")
    for rows in (api_workers, cli_workers):
        assert [r.pop("heartbeat_age_s") >= 0 for r in rows] == [True]
    assert api_workers == cli_workers
    assert api_workers[0]["jobs"] == ["running-1"] and api_workers[0]["alive"] is True
    assert api_workers[0]["version"] == queuectl.__version__ and "<th>version</th>" in d.get("/")


def test_dashboard_job_table_is_newest_first_filtered_and_paged(dashboard):
    d = dashboard()

    def ids(query):
        status, headers, body = d.request("/api/jobs" + query)
        assert status == 200, body
        return [job["id"] for job in body], int(headers["X-Total-Count"])

    assert ids("") == (["img-2", "img-1", "running-1", SCRIPT_ID, "done-1"], 5)
    assert ids("?state=&queue=") == ids("")
    assert ids("?state=pending") == (["img-2", "img-1"], 2)
    assert ids("?queue=images&limit=1&offset=1") == (["img-1"], 2)
    assert ids("?state=dead&queue=images") == ([], 0)
    assert ids("?limit=2&offset=2") == (["running-1", SCRIPT_ID], 5)
    assert ids("?offset=5") == ([], 5)


def test_dashboard_logs_of_a_run(dashboard):
    d = dashboard()
    latest = d.get("/api/jobs/done-1/logs")
    assert latest == {"id": "done-1", "run": 1, "output": "hello <b>world</b>\n", "output_bytes": 19,
                      "output_kept_bytes": 19, "ended_at": latest["ended_at"]}
    assert d.get("/api/jobs/done-1/logs?run=1") == latest
    assert d.get("/api/jobs/img-1/logs") == {"id": "img-1", "run": None, "output": None, "output_bytes": 0,
                                             "output_kept_bytes": 0, "ended_at": None}
    assert d.get("/api/jobs/running-1/logs")["ended_at"] is None


def test_dashboard_escapes_nothing_in_json_and_serves_json_as_json(dashboard):
    d = dashboard()
    status, headers, job = d.request("/api/jobs/" + quote_id(SCRIPT_ID))
    assert status == 200 and job["id"] == SCRIPT_ID and job["output"] == "<img src=x onerror=alert(2)>\n"
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"


def test_dashboard_page_is_self_contained_and_carries_no_queue_data(dashboard):
    d = dashboard()
    status, headers, page = d.request("/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    csp = headers["Content-Security-Policy"]
    nonce = csp.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in page and "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert headers["X-Frame-Options"] == "DENY"
    assert page.count("<script") == 1 and "src=" not in page and "@import" not in page
    assert "https://" not in page and page.replace("http://www.w3.org/2000/svg", "").count("http://") == 0
    assert "innerHTML" not in page and "outerHTML" not in page and "insertAdjacentHTML" not in page
    for job_id in ("done-1", "img-1", "img-2", "running-1", "alert(1)"):
        assert job_id not in page


def test_the_dashboard_page_shows_times_as_the_cli_does_in_utc_never_the_browsers_zone():
    script = queuectl.DASHBOARD_PAGE
    for local_getter in ("getHours", "getMinutes", "getDate(", "getMonth", "getFullYear", "toDateString",
                         "toLocaleTimeString", "toLocaleDateString"):
        assert local_getter not in script, local_getter
    assert "const hhmm = (iso) => `${iso.slice(11, 16)}Z`;" in script and "return j.next_run_at;" in script


def test_dashboard_bad_requests_get_json_errors_and_the_server_lives_on(dashboard):
    d = dashboard(allow_actions=True)
    cases = [
        ("/nope", 404), ("/api", 404), ("/api/jobs/done-1/nope", 404), ("/api/jobs/missing", 404),
        ("/api/jobs/missing/logs", 404), ("/api/jobs/done-1/logs?run=2", 404),
        ("/api/jobs?state=bogus", 400), ("/api/jobs?limit=0", 400), ("/api/jobs?limit=abc", 400),
        ("/api/jobs?limit=1001", 400), ("/api/jobs?offset=-1", 400), ("/api/jobs?limit=" + "9" * 5000, 400),
        ("/api/jobs?state=dead&state=pending", 400), ("/api/jobs?colour=red", 400), ("/?x=1", 400),
        ("/api/jobs?queue=bad%20name", 400), ("/api/status?queue=" + "q" * 65, 400),
        ("/api/stats?since=forever", 400), ("/api/jobs/done-1/logs?run=x", 400),
        ("/api/jobs/done-1/logs?run=0", 400), ("/api/throughput?minutes=0", 400), ("/api/jobs/%FF", 400),
        ("/api/jobs/%01", 400), ("/api/jobs?state=%FF", 400),
    ]
    for path, expected in cases:
        status, _, body = d.request(path)
        assert (status, type(body)) == (expected, dict) and body["error"], (path, status, body)
    for method, path, expected in (("POST", "/api/status", 405), ("POST", "/", 405),
                                   ("PUT", "/api/status", 501), ("DELETE", "/api/jobs/done-1", 501)):
        status, _, body = d.request(path, method=method, auth="header")
        assert status == expected and body["error"], (method, path, status, body)
    assert b'{"error": "Bad request' in raw_http(d, b"GARBAGE\r\n\r\n")
    assert raw_http(d, b"GET /" + b"x" * 70000 + b" HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 414")
    assert raw_http(d, b"POST /api/jobs/img-1/cancel HTTP/1.0\r\nContent-Length: x\r\n\r\n").startswith(b"HTTP/1.0 400")
    assert d.get("/api/status")["jobs"]["pending"] == 2  # still serving


def test_dashboard_get_never_writes(sqlite_dashboard):
    d = sqlite_dashboard(allow_actions=True)
    before = d.store.read("PRAGMA data_version")  # changes when another connection commits
    for path in ("/", "/api/status", "/api/stats", "/api/throughput", "/api/jobs", "/api/workers",
                 "/api/jobs/done-1", "/api/jobs/done-1/logs", "/api/jobs/img-1/retry", "/api/jobs/img-1/cancel"):
        d.request(path)
    assert d.store.read("PRAGMA data_version") == before
    assert d.store.get("img-1").state == "pending"
    d.request("/api/jobs/img-1/cancel", method="POST", auth="header")
    assert d.store.read("PRAGMA data_version") != before  # the probe does see a write


def test_dashboard_get_requests_use_query_only_connections(dashboard, monkeypatch):
    d = dashboard(allow_actions=True)
    monkeypatch.setitem(queuectl.API_ROUTES, ("GET", "/api/status"), (lambda store, q, _: store.pause(["x"]), ()))
    status, _, body = d.request("/api/status")
    assert status == 500 and re.search("read-?only", body["error"]), body  # SQLite: readonly; PostgreSQL: read-only
    assert d.store.paused() == []


def test_dashboard_actions_are_refused_without_allow_actions(dashboard):
    d = dashboard()
    for action, job_id in (("retry", SCRIPT_ID), ("cancel", "img-1"), ("delete", "done-1")):
        status, _, body = d.request(f"/api/jobs/{quote_id(job_id)}/{action}", method="POST", auth="header")
        assert status == 403 and "--allow-actions" in body["error"], (action, body)
    assert job_states(d) == {"done-1": "completed", SCRIPT_ID: "dead", "running-1": "processing",
                             "img-1": "pending", "img-2": "pending"}


def test_dashboard_actions_need_the_token_in_a_header(dashboard):
    d = dashboard(allow_actions=True)
    path = "/api/jobs/" + quote_id(SCRIPT_ID) + "/retry"
    cookie = {"Cookie": f"queuectl_token_{d.server.server_address[1]}={DASH_TOKEN}"}  # what an older version set
    refused = [d.request(path, method="POST", auth=None, headers=cookie),
               d.request(path + "?token=" + DASH_TOKEN, method="POST", auth=None),
               d.request(path, method="POST", auth=None, headers={**cookie, "X-Queuectl-Token": "wrong"}),
               d.request(path, method="POST", auth="header", headers={"Origin": "http://evil.example"})]
    assert [status for status, _, _ in refused] == [403] * 4
    assert d.store.get(SCRIPT_ID).state == "dead"
    status, _, job = d.request(path, method="POST", auth="header")
    assert status == 200 and job["id"] == SCRIPT_ID and job["state"] == "pending"


def test_dashboard_without_a_token_still_wants_the_header_for_actions(dashboard):
    d = dashboard(token=None, allow_actions=True)
    assert d.request("/api/jobs/img-1/cancel", method="POST", auth=None)[0] == 403
    status, _, job = d.request("/api/jobs/img-1/cancel", method="POST", auth=None, headers={"X-Queuectl-Token": ""})
    assert status == 200 and job["state"] == "dead"


def test_dashboard_actions_retry_cancel_delete_and_their_errors(dashboard):
    d = dashboard(allow_actions=True)

    def post(job_id, action):
        return d.request(f"/api/jobs/{quote_id(job_id)}/{action}", method="POST", auth="header")[:3:2]

    assert post("img-1", "cancel") == (200, {**d.store.get("img-1").to_dict(), "state": "dead"})
    assert post("done-1", "delete") == (200, {"id": "done-1", "deleted": True})
    assert d.request("/api/jobs/done-1")[0] == 404
    for job_id, action, expected in (("img-2", "retry", 409), ("running-1", "delete", 409), ("img-1", "cancel", 409),
                                     ("missing", "retry", 404), ("missing", "cancel", 404)):
        status, body = post(job_id, action)
        assert status == expected and job_id in body["error"], (job_id, action, status, body)
    assert post("running-1", "cancel")[0] == 200  # a running job: its worker is asked to kill it


def test_minute_buckets_fill_every_minute_of_the_window():
    start = queuectl.chart_start(7259.5, 3)  # now is in minute 120: the chart shows minutes 118-120
    assert start == 118 * 60
    buckets = queuectl.minute_buckets([(0, "completed", 4), (2, "dead", 1), (2, "failed", 2), (3, "completed", 9),
                                       (-1, "completed", 9)], start, 3)
    assert buckets == [{"at": queuectl.iso(7080), "completed": 4, "failed": 0, "dead": 0},
                       {"at": queuectl.iso(7140), "completed": 0, "failed": 0, "dead": 0},
                       {"at": queuectl.iso(7200), "completed": 0, "failed": 2, "dead": 1}]


def test_runs_per_minute_counts_finished_runs_by_minute(tmp_path):
    store = queuectl.SqliteStore(str(tmp_path / "q.db"))
    store.register("w", queuectl.host_identity(), 1, 0)
    settings = {**store.config_all(), "backoff_base": 1}
    for n, (code, ended) in enumerate([(0, 6000), (0, 6059.9), (1, 6060), (0, 6150), (0, 5999)]):
        spec = queuectl.validate_job({"id": f"j{n}", "command": "true", "max_retries": 2}, settings, "/tmp", 0)
        store.enqueue([spec], 0)
        job = store.claim("w", 1)
        store.finish(job, "w", queuectl.Outcome(code, None, "", ended - 1), settings, ended)  # it started at 1
    store.claim("w", 7000)  # j2's retry: running, not counted
    assert sorted(store.runs_per_minute(6000)) == [(0, "completed", 2), (1, "failed", 1), (2, "completed", 1)]
    store.close()


def test_dashboard_command_prints_the_url_and_stops_cleanly_on_ctrl_c(db):
    import signal
    import urllib.request
    proc, url = start_dashboard_process(db)
    base, _, fragment = url.partition("/#token=")  # the token only in the fragment, which no browser sends
    assert base.startswith("http://127.0.0.1:") and fragment and "?" not in url, url
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(base + "/api/status", headers={"X-Queuectl-Token": fragment})
    with opener.open(request, timeout=30) as res:
        assert json.loads(res.read())["jobs"]["pending"] == 0
    code, err = stop_dashboard_process(proc, signal.SIGINT)
    assert code == 0 and "Traceback" not in err and "stopped" in err and "warning" not in err, err


def test_dashboard_command_warns_when_not_on_loopback_and_stops_on_sigterm(sqlite_db):
    import signal
    proc, url = start_dashboard_process(sqlite_db, "--bind", "0.0.0.0", "--no-token")
    assert url.startswith("http://") and "token" not in url, url
    code, err = stop_dashboard_process(proc, signal.SIGTERM)
    assert code == 0 and "warning" in err and "0.0.0.0" in err and "Traceback" not in err, err


def test_dashboard_command_rejects_a_bad_port_and_a_port_in_use(tmp_path, sqlite_dashboard, capsys):
    assert queuectl.main(["--db", str(tmp_path / "x.db"), "dashboard", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    busy = sqlite_dashboard()
    port = str(busy.server.server_address[1])
    assert queuectl.main(["--db", str(tmp_path / "x.db"), "dashboard", "--port", port]) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_dashboard_refuses_actions_without_a_token_off_loopback_before_listening(tmp_path, monkeypatch, capsys):
    served = []

    def serve(self, bind, port):
        served.append(bind)
        raise queuectl.QueueError("not serving in this test")
    monkeypatch.setattr(queuectl.Dashboard, "serve", serve)
    db = str(tmp_path / "x.db")
    for bind in ("0.0.0.0", "::", ""):
        assert queuectl.main(["--db", db, "dashboard", "--bind", bind, "--no-token", "--allow-actions"]) == 2
        assert_one_error(capsys.readouterr().err, "--no-token", "--allow-actions")
    assert served == []
    for flags in (["--bind", "127.0.0.1", "--no-token", "--allow-actions"], ["--bind", "0.0.0.0", "--allow-actions"],
                  ["--bind", "0.0.0.0", "--no-token"]):
        assert queuectl.main(["--db", db, "dashboard", *flags]) == 1
    assert served == ["127.0.0.1", "0.0.0.0", "0.0.0.0"]


def test_dashboard_in_a_real_browser_shows_the_queue_from_the_api(dashboard, tmp_path):
    d = dashboard(allow_actions=True)
    served = d.request("/")[2]
    assert "img-2" not in served and "alert(" not in served
    dom = chromium_dom(f"{d.base}/#token={DASH_TOKEN}&job={quote_id(SCRIPT_ID)}", tmp_path)
    counts = {"pending": 2, "processing": 1, "completed": 1, "failed": 0, "dead": 1, "workers": 1}
    for name, count in counts.items():
        assert f'id="n-{name}">{count}<' in dom, (name, count)
    assert ">img-2</td>" in dom  # a job row the served HTML did not have: drawn from /api/jobs
    assert "&lt;script&gt;alert(1)&lt;/script&gt;</td>" in dom  # the id as text in the job table ...
    assert '<div id="jobtitle">&lt;script&gt;alert(1)&lt;/script&gt;</div>' in dom  # ... and in the job view
    assert "&lt;img src=x onerror=alert(2)&gt;" in dom  # its output, as text
    assert dom.count("<script") == served.count("<script") == 1 and "<img" not in dom
    assert 'class="completed"></rect>' in dom and 'class="dead"></rect>' in dom  # the chart, from /api/throughput
    assert "Retry</button>" in dom  # --allow-actions: the dead job can be retried
    assert ">running-1</button>" in dom  # the worker's current job, in the workers table
    assert '<button id="retryall" class="retry">Retry all dead</button>' in dom  # shown with --allow-actions
    assert '<td class="num">1/1</td>' in dom and '<td class="num">0/3</td><td>now</td>' in dom  # attempts, due
    assert '<td class="muted">all</td>' in dom  # the worker serves every queue


def test_dashboard_in_a_real_browser_without_a_token_says_how_to_get_in(dashboard, tmp_path, monkeypatch):
    d = dashboard()
    asked = recorded_requests(d, monkeypatch)
    dom = chromium_dom(f"{d.base}/", tmp_path)  # a bare URL, as in a new tab: no token in this tab
    assert "This tab has no access token: open the URL that `queuectl dashboard` printed" in dom
    assert '<span id="live" class="down">no token</span>' in dom and 'id="n-pending">–<' in dom
    assert [path for path, _ in asked] == ["/"]  # it does not poll the API for 403s


def test_dashboard_in_a_real_browser_keeps_the_token_from_other_ports_and_through_a_reload(dashboard, tmp_path,
                                                                                            monkeypatch):
    """The reported leak: Alice opens the printed URL, then visits bob's server on another loopback
    port; a cookie for 127.0.0.1 went there too (browsers do not separate cookies by port)."""
    d = dashboard()
    asked = recorded_requests(d, monkeypatch)

    def loaded(n, token):  # the page was loaded n times, and after its nth load it called the API with token
        loads = [i for i, (target, _) in enumerate(asked) if target.partition("?")[0] == "/"]
        return len(loads) >= n and any(target.startswith("/api/") and headers.get("X-Queuectl-Token") == token
                                       for target, headers in asked[loads[n - 1]:])
    steps = {"/wait/1": (1, "stale"), "/wait/2": (1, DASH_TOKEN), "/wait/3": (2, DASH_TOKEN)}

    def answer(path):
        try:
            return "ok" if wait_for(lambda: loaded(*steps[path]), f"{path}: {steps[path]}") else ""
        except (AssertionError, KeyError):
            return "no"
    # bob's page opens the dashboard in a tab with a stale token (a restarted dashboard), then goes to
    # the printed URL there (only the fragment changes: no reload), then to the bare URL (a reload:
    # sessionStorage keeps the token), then calls home, with whatever the browser holds for 127.0.0.1.
    # (A timer before /wait/2: with a fetch pending, virtual time holds the other tab's fragment
    # navigation until the fetch ends; the timer lets it run first. The wait itself polls.)
    script = (f"const tab = window.open({json.dumps(d.base + '/#token=stale')}); (async () => {{"
              "const say = async (path) => out.append(' ' + await (await fetch(path)).text());"
              f"await say('/wait/1'); tab.location = {json.dumps(d.dashboard.url(d.server))};"
              "await new Promise((done) => setTimeout(done, 100)); await say('/wait/2');"
              f"tab.location = {json.dumps(d.base + '/')}; await say('/wait/3'); await say('/home'); }})();")
    bob = neighbour_server(f"<!doctype html><p id=out>bob:</p><script>{script}</script>", answer)
    try:
        dom = chromium_dom(bob.base + "/", tmp_path, "--disable-popup-blocking")
    finally:
        bob.shutdown()
    assert '<p id="out">bob: ok ok ok no</p>' in dom, dom[-2000:]
    assert [target for target, _ in asked if target.partition("?")[0] == "/"] == ["/", "/"]  # two loads, not three
    assert [path for path, _ in bob.asked if path != "/favicon.ico"] == ["/", "/wait/1", "/wait/2", "/wait/3", "/home"]
    for path, headers in bob.asked:
        assert "Cookie" not in headers and DASH_TOKEN not in path + repr(headers), (path, headers)
    assert not any("Cookie" in headers for _, headers in asked)


def test_dashboard_answers_within_2_s_and_stays_idle_while_1100_half_open_connections_are_held(sqlite_db):
    """Slowloris against the usual limit of 1,024 descriptors: 1,100 connections that send part of a
    request and wait once took every descriptor, so a real request timed out and the accept loop spun."""
    import resource
    import urllib.request
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip("needs more than 1,300 open files in the test process")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    proc, url = start_dashboard_process(sqlite_db, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_NOFILE, (1024, hard)))
    held = []
    try:
        base, _, token = url.partition("/#token=")
        host, port = base.removeprefix("http://").split(":")
        # Settled when the server has closed all it does not hold; on a server that closes none, the
        # request below is simply made after the wait.
        held = hold_half_open_connections(proc.pid, (host, int(port)), 1100,
                                          lambda closed: closed >= 1100 - queuectl.MAX_CONNECTIONS)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        started, answer = time.monotonic(), None
        try:
            with opener.open(urllib.request.Request(base + "/api/status", headers={"X-Queuectl-Token": token}),
                             timeout=2) as res:
                answer = res.status, json.loads(res.read())
        except OSError as e:
            answer = e
        took = time.monotonic() - started
        share = cpu_share(proc.pid, 3)
        assert isinstance(answer, tuple) and answer[0] == 200 and "jobs" in answer[1] and took < 2, (answer, took,
                                                                                                      share)
        assert share < 0.1, f"the dashboard used {share:.0%} of a core while the connections were held"
    finally:
        for conn in held:
            conn.close()
        proc.kill()
        proc.communicate(timeout=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_dashboard_out_of_descriptors_pauses_accepting_instead_of_spinning(sqlite_db):
    """A connection that accept() cannot take for want of a descriptor stays in the listen queue, so
    the listening socket stays readable: the server must wait, not call accept() again at once."""
    import resource
    proc, url = start_dashboard_process(sqlite_db)
    conn = None
    try:
        base, _, token = url.partition("/#token=")
        host, port = base.removeprefix("http://").split(":")
        _, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        taken = {int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd")}
        lowest_free = min(set(range(len(taken) + 1)) - taken)
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor left to take
        conn = socket.create_connection((host, int(port)), timeout=WAIT_S)
        conn.sendall(f"GET /api/status HTTP/1.0\r\nHost: 127.0.0.1\r\n{queuectl.TOKEN_HEADER}: {token}\r\n\r\n"
                     .encode())
        share = cpu_share(proc.pid, 3)
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (1024, hard))
        reply = conn.makefile("rb").readline()
        assert share < 0.1 and reply.startswith(b"HTTP/1.0 200 "), (share, reply)
    finally:
        if conn:
            conn.close()
        code, err = stop_dashboard_process(proc, signal.SIGTERM)
    assert code == 0 and err.count("out of file descriptors") == 1, err


@pytest.mark.parametrize("slow_part", ["headers", "body"])
def test_dashboard_closes_a_request_that_trickles_past_its_deadline(sqlite_dashboard, monkeypatch, slow_part):
    """A byte every 0.1 s never lets a per-read timeout fire; the deadline counts for the whole request
    (shortened here so the test is quick; it is read when a connection is accepted)."""
    monkeypatch.setattr(queuectl, "REQUEST_DEADLINE_S", 1.0)
    d = sqlite_dashboard(allow_actions=True)
    body = b"x" * 60
    head = (f"POST /api/jobs/img-1/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Queuectl-Token: {DASH_TOKEN}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sent_at_once, trickled = (head[:20], head[20:] + body) if slow_part == "headers" else (head, body)
    earlier_threads = request_threads()
    conn = socket.create_connection(("127.0.0.1", d.server.server_address[1]), timeout=WAIT_S)
    trickle_ended = []

    def trickle():
        try:
            for i in range(len(trickled)):
                conn.send(trickled[i:i + 1])
                time.sleep(0.1)
            trickle_ended.append("all sent")
        except OSError as e:
            trickle_ended.append(e)
    try:
        conn.sendall(sent_at_once)
        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            reply = conn.recv(4096)  # the server's end of the connection, or its reply
        except ConnectionResetError:  # the end, sent as a reset: bytes were still arriving
            reply = b""
        assert reply == b"" and not trickle_ended, (reply, trickle_ended)
        wait_for(lambda: not request_threads() - earlier_threads, "the connection's thread to end")
        assert d.store.get("img-1").state == "pending"  # nothing was acted on
        sender.join(WAIT_S)
    finally:
        conn.close()


def test_dashboard_reads_no_request_head_beyond_its_bound(sqlite_dashboard, monkeypatch):
    """http.server alone takes 100 header lines of 64 KiB each: a connection sending that, short of the
    blank line that ends them, held 6 MB until its deadline (pushed out of reach here). Past
    MAX_REQUEST_HEAD + MAX_REQUEST_BODY bytes it is closed unanswered; a large head within the bound is
    answered."""
    monkeypatch.setattr(queuectl, "REQUEST_DEADLINE_S", 3600.0)
    d = sqlite_dashboard()
    cookie = "c=" + "x" * 60_000  # within the bound: a host's cookies can run to tens of KB
    assert d.request("/api/status", headers={"Cookie": cookie})[0] == 200
    conn = socket.create_connection(("127.0.0.1", d.server.server_address[1]), timeout=WAIT_S)
    try:
        line = b"X-Filler: " + b"x" * 60_000 + b"\r\n"
        with contextlib.suppress(OSError):  # the server may close while this still sends
            conn.sendall(b"GET /api/status HTTP/1.0\r\n")
            for _ in range(99):
                conn.sendall(line)
        try:
            reply = conn.recv(4096)
            while reply and (more := conn.recv(4096)):
                reply += more
        except ConnectionResetError:  # the end, sent as a reset: bytes were still arriving
            reply = b""
        except TimeoutError:
            reply = "neither answered nor closed"
        assert reply == b"", reply[:100]
    finally:
        conn.close()


def test_dashboard_makes_way_at_the_cap_when_every_connection_holds_a_reply_its_client_does_not_read(
        sqlite_dashboard, monkeypatch):
    """A client that asks for a big page and reads none of it holds its connection for as long as the
    reply's writes may take: at the cap, the oldest of those makes way for a newcomer, as one still
    sending its request would (the cap is lowered here so that a few such clients reach it)."""
    monkeypatch.setattr(queuectl, "MAX_CONNECTIONS", 2)
    d = sqlite_dashboard()
    add_big_jobs(d)
    earlier_threads, stalled = request_threads(), []
    try:
        for _ in range(queuectl.MAX_CONNECTIONS):
            stalled.append(big_page_unread(d))
        assert request_status(d, "/api/status") == 200
    finally:
        for conn in stalled:
            conn.close()
    wait_for(lambda: not request_threads() - earlier_threads, "the connections' threads to end")


def test_dashboard_at_the_cap_cuts_a_request_still_arriving_before_any_reply(sqlite_dashboard, monkeypatch):
    """A reply is cut only when no request is arriving: a flood of connections that send nothing must not
    cut the replies of real requests, most of which are out in one write."""
    monkeypatch.setattr(queuectl, "MAX_CONNECTIONS", 2)
    d = sqlite_dashboard()
    add_big_jobs(d)
    earlier_threads = request_threads()
    replying = big_page_unread(d)  # the older of the two
    arriving = socket.create_connection(("127.0.0.1", d.server.server_address[1]), timeout=WAIT_S)
    try:
        arriving.sendall(b"GET /api/status HTTP/1.0\r\n")
        wait_for(lambda: len(request_threads() - earlier_threads) == 2, "both connections to be served")
        assert request_status(d, "/api/status") == 200
        with contextlib.suppress(ConnectionResetError):
            assert arriving.recv(100) == b""  # closed unanswered
        reply = b"HTTP/1.0 200"
        while part := replying.recv(1 << 20):
            reply += part
        head, body = reply.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])
        assert len(body) == length and len(json.loads(body)) >= 100  # the whole reply came
    finally:
        arriving.close()
        replying.close()


def test_dashboard_api_gives_the_kept_and_printed_sizes(dashboard):
    d = dashboard()
    add_truncated_run(d.store, "cut-1", 1024, 14_889_779)
    run = d.get("/api/jobs/cut-1")["runs"][-1]
    assert (run["output_bytes"], run["output_kept_bytes"], len(run["output"])) == (14_889_779, 1024, 1024)
    logs = d.get("/api/jobs/cut-1/logs")
    assert (logs["output_bytes"], logs["output_kept_bytes"]) == (14_889_779, 1024)


def test_dashboard_in_a_real_browser_says_when_output_was_cut(sqlite_dashboard, tmp_path):
    d = sqlite_dashboard()
    add_truncated_run(d.store, "cut-1", 1024, 14_889_779)
    dom = chromium_dom(f"{d.base}/#token={DASH_TOKEN}&job=cut-1", tmp_path)
    assert "run 1 output, last 1 KiB of 14.2 MiB</summary>" in dom
    dom = chromium_dom(f"{d.base}/#token={DASH_TOKEN}&job=done-1", tmp_path)
    assert "run 1 output, 19 B</summary>" in dom


def test_dashboard_metrics_need_the_token_and_are_prometheus_text(dashboard):
    d = dashboard()
    for headers in ({}, {"X-Queuectl-Token": "wrong"}):
        status, _, body = d.request("/metrics", auth=None, headers=headers)
        assert status == 403 and "token" in body["error"]
    status, headers, body = d.request("/metrics", auth="header")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = prometheus_families(body)
    assert sample(families, "queuectl_jobs", queue="images", state="pending") == 2
    assert sample(families, "queuectl_workers") == 1  # the seeded worker is this test process
    open_one = DashboardUnderTest(d.path, token=None)
    try:
        assert open_one.request("/metrics", auth=None)[0] == 200  # --no-token
    finally:
        open_one.close()


def test_dashboard_retry_all_dead_respects_the_queue_filter(dashboard):
    d = dashboard(allow_actions=True)
    assert d.request("/api/dlq/retry?queue=images", method="POST", auth="header")[::2] == (200, {"ids": []})
    assert d.store.get(SCRIPT_ID).state == "dead"
    assert d.request("/api/dlq/retry", method="POST", auth="header")[::2] == (200, {"ids": [SCRIPT_ID]})
    assert d.store.get(SCRIPT_ID).state == "pending"
    assert d.request("/api/dlq/retry?queue=a%20b", method="POST", auth="header")[0] == 400
    assert d.request("/api/dlq/retry?state=dead", method="POST", auth="header")[0] == 400
    assert d.request("/api/dlq/retry")[0] == 405


def test_dashboard_retry_all_dead_needs_allow_actions(dashboard):
    d = dashboard()
    assert d.request("/api/dlq/retry", method="POST", auth="header")[0] == 403
    assert d.store.get(SCRIPT_ID).state == "dead"


def test_dashboard_lists_schedules_as_the_cli_does(dashboard, capsys):
    d = dashboard()
    ok(d.path, "schedule", "add", '{"id": "nightly", "cron": "@daily", "tz": "UTC", "command": "true"}')
    assert d.get("/api/schedules") == cli_json(capsys, d.path, "schedule", "list")
    assert d.get("/api/schedules")[0]["id"] == "nightly"
    page = d.get("/")
    assert '<tbody id="schedules">' in page and "loadSchedules()" in page


def test_dashboard_queues_equal_the_cli_and_the_page_has_the_table(dashboard, capsys):
    d = dashboard()
    with opened(d.path) as s:
        s.set_limit("images", 2)
    assert d.get("/api/queues") == cli_json(capsys, d.path, "queues")
    assert [q["limit"] for q in d.get("/api/queues") if q["queue"] == "images"] == [2]
    status, _, page = d.request("/")
    assert status == 200 and 'id="queues"' in page and "/api/queues" in page


def test_a_dashboard_post_with_a_content_length_that_is_no_ascii_number_gets_400(dashboard):
    """'²' passes str.isdigit() but int() refuses it: the handler died without an answer."""
    d = dashboard(allow_actions=True)
    for length in (b"\xb2", b"9" * 5000):
        answer = raw_http(d, b"POST /api/jobs/img-1/cancel HTTP/1.0\r\nContent-Length: " + length + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 400"), answer
    assert d.get("/api/jobs/img-1")["state"] == "pending"


# ---- metrics: Prometheus text exposition ---------------------------------------------------------

def test_metrics_count_jobs_workers_waits_and_runs(store):
    now = T0
    register(store)
    store.enqueue([spec("slow", queue="a"), spec("fast", queue="a"), spec("bad", queue="a", max_retries=0)], now - 4000)
    # one run ended within the hour, two within the minute
    for code, duration, ended in ((0, 2.0, now - 1800), (0, 0.5, now - 30), (3, 0.5, now - 20)):
        job = store.claim("w1", ended - duration)
        store.finish(job, "w1", outcome(code, None if code == 0 else "exit code 3", "x", duration), SETTINGS, ended)
    store.enqueue([spec("due", queue="b", run_at=now - 90), spec("later", queue="b", run_at=now + 90)], now - 100)
    store.enqueue([spec("held", queue="p")], now - 500)
    store.pause(["p"])
    store.deregister("w1")
    text = queuectl.metrics_text(store, now)
    families = prometheus_families(text)
    assert set(families) == {"queuectl_jobs", "queuectl_workers", "queuectl_oldest_due_age_seconds",
                             "queuectl_runs_finished", "queuectl_run_duration_seconds",
                             "queuectl_run_duration_seconds_sum", "queuectl_run_duration_seconds_count"}
    assert sample(families, "queuectl_jobs", queue="a", state="completed") == 2
    assert sample(families, "queuectl_jobs", queue="a", state="dead") == 1
    assert sample(families, "queuectl_jobs", queue="a", state="pending") == 0  # every state of a queue
    assert sample(families, "queuectl_jobs", queue="b", state="pending") == 2
    assert len(families["queuectl_jobs"]) == 3 * 5
    assert sample(families, "queuectl_workers") == len(queuectl.live_workers(store)) == 0
    assert families["queuectl_oldest_due_age_seconds"] == {frozenset({("queue", "a")}): 0,
                                                           frozenset({("queue", "b")}): 90}  # p is paused
    assert sample(families, "queuectl_runs_finished", outcome="completed", window="1m") == 1
    assert sample(families, "queuectl_runs_finished", outcome="dead", window="1m") == 1
    assert sample(families, "queuectl_runs_finished", outcome="completed", window="1h") == 2
    assert sample(families, "queuectl_runs_finished", outcome="lost", window="1h") == 0
    assert len(families["queuectl_runs_finished"]) == 2 * 6
    assert sample(families, "queuectl_run_duration_seconds", quantile="0.5") == 0.5
    assert sample(families, "queuectl_run_duration_seconds", quantile="0.95") == 2.0
    assert sample(families, "queuectl_run_duration_seconds_sum") == 3.0
    assert sample(families, "queuectl_run_duration_seconds_count") == 3
    for name in families.keys() - {"queuectl_run_duration_seconds_sum", "queuectl_run_duration_seconds_count"}:
        kind = "summary" if name in SUMMARIES else "gauge"
        assert f"# HELP {name} " in text and f"# TYPE {name} {kind}\n" in text


def test_metrics_keep_the_exposition_formats_rules(store):
    """What `promtool check metrics` checks (and runs it where it is installed): a `quantile` label only
    on a summary, `le` only on a histogram, a summary with its _sum and _count, one TYPE line per family
    naming the family its samples belong to."""
    register(store)
    store.enqueue([spec("a"), spec("b")], T0)
    for ended in (T0 + 10, T0 + 20):
        store.finish(store.claim("w1", ended - 1.25), "w1", outcome(0, None, "x", 1.25), SETTINGS, ended)
    text = queuectl.metrics_text(store, T0 + 30)
    for family in parsed_families(text):
        names = {s.name for s in family.samples}
        if family.type != "summary":
            assert all("quantile" not in s.labels for s in family.samples), family
        if family.type != "histogram":
            assert all("le" not in s.labels for s in family.samples), family
        if family.type == "summary":
            assert {family.name + "_sum", family.name + "_count"} <= names, family
        assert names <= {family.name, family.name + "_sum", family.name + "_count"}, family
    types = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
    assert len(types) == len({name for name, _ in types}) == text.count("# HELP ")
    for line in text.splitlines():  # every sample follows the TYPE line of its own family
        if not line.startswith("#"):
            family = re.findall(r"^# TYPE (\S+) ", text[:text.index(line)], re.M)[-1]
            assert re.match(re.escape(family) + r"(_sum|_count)?[{ ]", line), (family, line)
    promtool = shutil.which("promtool")
    if promtool:
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_run_duration_sum_and_count_never_go_down_when_jobs_are_deleted(store):
    """_sum and _count are counters: rate(_sum)/rate(_count) must not see a reset when runs leave the
    database with their jobs (delete, purge, retention)."""
    register(store)
    store.enqueue([spec("a"), spec("b"), spec("c", max_retries=0), spec("d")], T0)
    for code, ended in ((0, T0 + 10), (0, T0 + 20), (3, T0 + 30)):
        job = store.claim("w1", ended - 0.5)
        store.finish(job, "w1", outcome(code, None if code == 0 else "exit code 3", "x", 0.5), SETTINGS, ended)
    assert store.run_totals() == (3, 1_500_000)
    store.delete(["a"])
    assert store.purge("completed", T0 + 100) == 1 and store.purge("dead", T0 + 100) == 1
    assert store.run_totals() == (3, 1_500_000)
    store.delete(["d"])  # no run: nothing to add
    store.enqueue([spec("e")], T0 + 40)
    store.finish(store.claim("w1", T0 + 40), "w1", outcome(0, None, "x", 0.25), SETTINGS, T0 + 40.25)
    assert store.run_totals() == (4, 1_750_000)
    families = prometheus_families(queuectl.metrics_text(store, T0 + 50))
    assert sample(families, "queuectl_run_duration_seconds_count") == 4
    assert sample(families, "queuectl_run_duration_seconds_sum") == 1.75
    assert set(store.config_all()) == set(queuectl.CONFIG)  # the tally is no setting


def test_deleting_many_jobs_adds_their_runs_to_the_tally_in_one_write(store):
    """A delete or a purge slice writes the tally's row once, not once per job: on PostgreSQL every write
    of it leaves a row version behind, and one write per job made purge far slower."""
    register(store)
    ids = [f"j{i}" for i in range(6)]
    store.enqueue([spec(i) for i in ids], T0)
    for i in ids:
        store.finish(store.claim("w1", T0), "w1", outcome(0, None, "x", 0.5), SETTINGS, T0 + 0.5)
    pg = isinstance(store, queuectl.PostgresStore)
    count_writes = ["CREATE TABLE tally_writes (n INTEGER NOT NULL)", "INSERT INTO tally_writes VALUES (0)"] + (
        ["CREATE FUNCTION count_tally_write() RETURNS trigger LANGUAGE plpgsql AS "
         "$$BEGIN UPDATE tally_writes SET n = n + 1; RETURN NULL; END$$",
         "CREATE TRIGGER tally_written AFTER INSERT OR UPDATE ON config FOR EACH ROW EXECUTE FUNCTION count_tally_write()"]
        if pg else
        [f"CREATE TRIGGER tally_{event} AFTER {event} ON config BEGIN UPDATE tally_writes SET n = n + 1; END"
         for event in ("INSERT", "UPDATE")])
    store.write(lambda cur: [cur.execute(statement) for statement in count_writes])

    def writes():
        return store.write(lambda cur: cur.execute("SELECT n FROM tally_writes").fetchone()[0])
    store.delete(ids[:3])
    assert writes() == 1 and store.run_totals() == (6, 3_000_000)
    assert store.purge("completed", T0 + 100) == 3
    assert writes() == 2 and store.run_totals() == (6, 3_000_000)


def test_metrics_cli_on_an_empty_queue(db):
    families = prometheus_families(ok(db, "metrics"))
    assert families["queuectl_jobs"] == {} and sample(families, "queuectl_workers") == 0
    assert math.isnan(sample(families, "queuectl_run_duration_seconds", quantile="0.5"))
    assert sample(families, "queuectl_runs_finished", outcome="completed", window="1h") == 0


def test_metrics_label_values_are_escaped():
    assert queuectl.prometheus_escape('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    text = queuectl._metric("queuectl_test", "A test.", [({"queue": 'x"\\\ny'}, 1), ({"queue": "plain"}, None)])
    families = prometheus_families(text)
    assert sample(families, "queuectl_test", queue='x"\\\ny') == 1
    assert math.isnan(sample(families, "queuectl_test", queue="plain"))


def test_a_past_run_at_leaves_every_wait_figure_small(dashboard):
    # `add --run-at 1` (1970) once made stats, metrics and the dashboard report a wait of ~1.8e9 s.
    small = 86400  # a generous bound for a slow machine, far below that
    d = dashboard()
    ok(d.path, "add", "--queue", "q1", "--run-at", "1", "--", "echo")
    for stats in (json.loads(ok(d.path, "stats", "--json")), d.get("/api/stats")):
        assert 0 <= stats["oldest_eligible_age_s"] < small
    families = prometheus_families(ok(d.path, "metrics"))
    assert 0 <= sample(families, "queuectl_oldest_due_age_seconds", queue="q1") < small
    families = prometheus_families(d.request("/metrics")[2])
    assert 0 <= sample(families, "queuectl_oldest_due_age_seconds", queue="q1") < small
    [row] = [line for line in ok(d.path, "list", "--queue", "q1").splitlines()[1:]]
    assert row.split()[4] == "now"  # DUE: due, waiting to be claimed
    finish_next(d.store, 0, d.store.now(), worker="dash-worker")
    for stats in (json.loads(ok(d.path, "stats", "--json")), d.get("/api/stats")):
        assert all(0 <= wait < small for wait in stats["wait_s"].values()), stats
    line = next(x for x in ok(d.path, "stats").splitlines() if x.startswith("wait:"))
    assert all(float(word.rstrip("s")) < small for word in line.split()[2::2]), line


# ==== CLI =========================================================================================

# ---- global options, argparse, start-up ----------------------------------------------------------

@sqlite_only
def test_version(db):
    code, out, err = cli(db, "--version")
    assert code == 0, err
    assert queuectl.__version__ in out
    result = subprocess.run([sys.executable, QUEUECTL, "--version"], capture_output=True,
                            text=True, timeout=WAIT_S, env=child_env())
    assert result.returncode == 0 and queuectl.__version__ in result.stdout


@sqlite_only
def test_help_exits_0(db):
    code, out, err = cli(db, "--help")
    assert code == 0 and "enqueue" in out


@sqlite_only
def test_worker_start_help_says_queue_may_be_repeated(db):
    code, out, err = cli(db, "worker", "start", "--help")
    assert code == 0 and "repeat" in out.split("--queue", 2)[-1], out


@sqlite_only
@pytest.mark.parametrize("args", [("bogus",), ("show",), ("enqueue",), ("dlq", "retry"),
                                  ("config", "set", "max-retries"), ("list", "--limit", "x"),
                                  ("status", "--bogus")])
def test_argparse_errors_exit_2(db, args):
    code, out, err = cli(db, *args)
    assert_argparse_error(code, err)


@sqlite_only
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


def test_usage_errors_are_found_before_the_database_is_opened(tmp_path):
    db = str(tmp_path / "never.db")
    for args in (("purge",), ("worker", "stop", "--timeout", "5"), ("dashboard", "--port", "70000"),
                 ("worker", "start", "--count", "0"),
                 ("dashboard", "--no-token", "--allow-actions", "--bind", "0.0.0.0")):
        code, _, err = run_main(["--db", db, *args])
        assert code == 2, (args, err)
    assert os.listdir(tmp_path) == []  # nothing created
    for name in (":memory:", "file:x.db?mode=memory"):
        code, _, err = run_main(["--db", name, "enqueue", '{"command": "true"}'])
        assert code == 2 and "is not a file path" in err


@sqlite_only
@pytest.mark.parametrize("command", [("cancel",), ("delete",), ("wait",), ("dlq", "retry")])
@pytest.mark.parametrize("bad_id", ["a\x01b", "", "i" * 201], ids=["control", "empty", "201-chars"])
def test_bad_ids_exit_2_changing_nothing(states_db, command, bad_id):
    before = snapshot(states_db)
    code, out, err = cli(states_db, *command, "wait", bad_id)
    assert (code, out) == (2, ""), err
    assert_one_error(err)
    assert snapshot(states_db) == before


def test_help_of_changed_commands_shows_the_new_options():
    for argv, options in ((["add"], ("--id", "--queue", "--priority", "--max-retries", "--timeout", "--delay",
                                     "--run-at", "--depends-on", "--env", "--cwd", "--json", "COMMAND")),
                          (["cancel"], ("--all", "--queue")), (["dlq", "retry"], ("--all", "--queue")),
                          (["wait"], ("--timeout DURATION",)), (["worker", "stop"], ("--timeout DURATION",)),
                          (["stats"], ("1w",)), (["purge"], ("1w",))):
        code, out, _ = run_main([*argv, "--help"])
        assert code == 0
        for option in options:
            assert option in out, (argv, option)


def test_a_command_builds_only_its_own_parser(db, monkeypatch):
    built = []
    init = queuectl.Parser.__init__

    def recording_init(self, *args, **kwargs):
        built.append(kwargs.get("prog"))
        init(self, *args, **kwargs)
    monkeypatch.setattr(queuectl.Parser, "__init__", recording_init)
    ok(db, "status")
    assert built == ["queuectl", "queuectl status"]
    built.clear()
    ok(db, "config", "list")
    assert built == ["queuectl", "queuectl config", "queuectl config set", "queuectl config get",
                     "queuectl config list"]


COMMAND_NAMES = ["enqueue", "add", "run", "cancel", "delete", "purge", "wait", "status", "list", "show", "logs", "stats",
                 "metrics", "pause", "resume", "limit", "queues", "dashboard", "worker", "dlq", "config", "schedule",
                 "help", "completion"]


def test_the_help_lists_every_command_once_and_each_has_its_own(tmp_path):
    code, out, _ = run_main(["--help"])
    assert code == 0
    commands = out.split("\ncommands:\n")[1].split("\n\n")[0]
    assert "positional arguments" not in out  # argparse's own list of the commands: they would show twice
    names = [line.strip().split("  ")[0] for line in commands.splitlines() if re.match(r"  [a-z]", line)]
    listed = [part.split()[0] for name in names for part in name.split(", ")]  # `status, list, …`, `dlq list|retry`
    assert sorted(listed) == sorted(COMMAND_NAMES), commands
    for name in COMMAND_NAMES:
        code, out, _ = run_main([name, "--help"])
        assert code == 0 and out.startswith(f"usage: queuectl {name} "), (name, out)
    code, _, err = run_main(["nope"])
    assert code == 2 and "invalid choice: 'nope' (choose from 'enqueue', 'add'," in err


@pytest.mark.parametrize("argv, nearest", [(["stauts"], "status"), (["enque", "{}"], "enqueue"),
                                           (["Status"], "status"), (["worker", "strat"], "start"),
                                           (["schedule", "lsit"], "list"), (["purge", "--state", "ded"], "dead")])
def test_a_mistyped_command_or_choice_gets_the_nearest_one(tmp_path, argv, nearest):
    code, out, err = run_main(["--db", str(tmp_path / "q.db"), *argv])
    assert (code, out) == (2, "")
    assert_one_error(err, f"invalid choice: {argv[-1] if argv[0] != 'enque' else 'enque'!r} (did you mean {nearest!r}?)")
    assert os.listdir(tmp_path) == []


def test_help_command_prints_a_commands_help(tmp_path):
    assert run_main(["help"]) == run_main(["--help"])
    assert run_main(["help", "worker"]) == run_main(["worker", "--help"])
    code, out, err = run_main(["help", "worker", "start"])
    assert code == 0 and out.startswith("usage: queuectl worker start ") and "--burst" in out, err
    code, out, err = run_main(["help", "stauts"])
    assert (code, out) == (2, "")
    assert_one_error(err, "(did you mean 'status'?)")
    code, out, err = run_main(["help", "help"])  # says what it is and what it takes, as every command does
    assert code == 0 and "\na command's help, as COMMAND --help" in out and "COMMAND     a command, and its action" in out


def test_bare_queuectl_prints_an_overview_on_stdout_and_exits_1_as_git_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main([])
    assert (code, err) == (1, "")
    assert out.startswith("usage: queuectl ") and "\ncommands:\n" in out and "positional arguments" not in out
    example = out.split("\nexample:\n")[1].splitlines()
    assert len(example) == 3 and all(line.startswith("  queuectl ") for line in example), out
    assert all(name in out for name in COMMAND_NAMES)
    assert os.listdir(tmp_path) == []


def test_db_and_json_go_before_or_after_the_command_and_the_later_one_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUEUECTL_DB", raising=False)
    assert run_main(["enqueue", '{"id": "x", "command": "true"}', "--db", "a.db"]) == (0, "x\n", "")
    for argv in (["status", "--db", "a.db", "--json"], ["--db", "a.db", "status", "--json"],
                 ["--json", "--db", "a.db", "status"], ["--json", "status", "--db", "a.db"],
                 ["--db", "b.db", "status", "--db", "a.db", "--json"]):
        code, out, err = run_main(argv)
        assert (code, err) == (0, "") and json.loads(out)["jobs"]["pending"] == 1, argv
    code, out, err = run_main(["--db", "a.db", "worker", "list", "--db", "b.db", "--json"])  # b.db: later
    assert (code, out) == (0, "[]\n") and err.startswith("queuectl: note: no queue at "), err
    code, out, err = run_main(["--json", "--db", "a.db", "pause"])
    assert (code, out) == (2, "")
    assert_one_error(err, "pause has no --json")
    assert sorted(os.listdir(tmp_path)) == ["a.db"] and json.loads(run_main(["--db", "a.db", "status", "--json"])[1])["paused"] == []


LEAF_COMMANDS = [[name] for name in COMMAND_NAMES if name not in ("worker", "dlq", "config", "schedule", "help")] + [
    ["worker", "start"], ["worker", "stop"], ["worker", "list"], ["dlq", "list"], ["dlq", "retry"], ["config", "set"],
    ["config", "get"], ["config", "list"], ["schedule", "add"], ["schedule", "list"], ["schedule", "next"],
    ["schedule", "update"], ["schedule", "pause"], ["schedule", "resume"], ["schedule", "remove"]]


@pytest.mark.parametrize("argv", LEAF_COMMANDS, ids=" ".join)
def test_every_option_of_every_command_has_a_help_text(argv):
    code, out, _ = run_main([*argv, "--help"])
    assert code == 0
    options = out.split("\noptions:\n")[1].split("\n\n")[0].splitlines()
    for n, line in enumerate(options):
        # An option's line: its help follows after two blanks, or on the next line, indented further.
        if line.startswith("  -") and "  " not in line.strip():
            following = options[n + 1] if n + 1 < len(options) else ""
            assert following.startswith(" " * 6) and not following.strip().startswith("-"), (argv, line)


def test_enqueue_and_schedule_add_and_update_help_list_the_json_fields_with_their_defaults():
    out = run_main(["enqueue", "--help"])[1].split("JSON fields (default):\n")[1]
    assert [line.split()[0] for line in out.splitlines()] == sorted(queuectl.JOB_FIELDS, key=out.index)
    assert re.search(r"^  max_retries +config max-retries \(3\)", out, re.M) and re.search(r"^  queue +default$", out, re.M)
    for command in ("add", "update"):
        out = run_main(["schedule", command, "--help"])[1].split("JSON fields (default):\n")[1]
        assert all(re.search(rf"^  {field} ", out, re.M) for field in queuectl.SCHEDULE_FIELDS)
        assert ", ".join(queuectl.TEMPLATE_FIELDS) in out and re.search(r"^  overlap +skip", out, re.M)


def test_options_of_a_lazily_built_command_still_parse_and_fail_as_before(db):
    code, _, err = cli(db, "stats", "--since", "zz")
    assert code == 2 and err.startswith("queuectl: error: argument --since:")
    code, _, err = cli(db, "worker", "start", "--log-format", "x")
    assert code == 2 and "argument --log-format: invalid choice: 'x'" in err


# ---- enqueue and add -----------------------------------------------------------------------------

@sqlite_only
@pytest.mark.parametrize("text, hint", [("echo hi", "queuectl add -- echo hi"),
                                        ("make && make install", "queuectl add -- 'make && make install'")])
def test_enqueue_of_a_command_line_points_to_add(db, text, hint):
    code, out, err = cli(db, "enqueue", text)
    assert (code, out) == (2, "")
    assert_one_error(err, "invalid JSON", f"(to enqueue a command line: {hint})")
    assert list_ids(db) == []


@sqlite_only
@pytest.mark.parametrize("text", ['{"command": ', '["echo hi"', '"echo hi'])
def test_enqueue_of_broken_json_gets_no_hint_to_add(db, text):
    code, out, err = cli(db, "enqueue", text)
    assert (code, out) == (2, "")
    assert_one_error(err, "invalid JSON")
    assert "queuectl add" not in err


@pytest.mark.parametrize("args", [("enqueue", "echo hi"), ("enqueue", '{"command": 5}'), ("enqueue", "[]"),
                                  ("config", "set", "max-retries", "abc"), ("config", "set", "retention"),
                                  ("schedule", "add", '{"id": "s", "command": "true"}'),
                                  ("schedule", "update", "s", '{"every": "1h"'),
                                  ("add", "--run-at", "garbage", "--", "true"), ("add", "--env", "X", "--", "true")])
def test_invalid_input_to_a_command_that_writes_creates_no_queue(db, args):
    """A typo in the wrong folder leaves no empty queue there, which would hide the next `no queue at` note."""
    code, out, err = cli(db, *args)
    assert (code, out) == (2, "") and not err.startswith("queuectl: note:"), err
    assert not (pg_schema_exists(db) if is_pg(db) else os.path.exists(db)), args


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


@sqlite_only
@pytest.mark.parametrize("text, fragment", [case[1:] for case in BAD_ENQUEUE],
                         ids=[case[0] for case in BAD_ENQUEUE])
def test_enqueue_rejects_bad_input_and_changes_nothing(seeded_db, text, fragment):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", text)
    assert (code, out) == (2, ""), err
    assert_one_error(err, *([fragment] if fragment else []))
    assert snapshot(seeded_db) == before


def test_add_joins_several_words_with_shell_quoting_and_runs_exactly_them(db, workers, tmp_path):
    out = ok(db, "add", "--id", "p", "--cwd", str(tmp_path), "--", "printf", "%s|", "my file", "c$d", "-n")
    assert out == "p\n"
    assert get_job(db, "p")["command"] == "printf '%s|' 'my file' 'c$d' -n"
    assert workers.start("--burst").wait() == 0
    assert ok(db, "logs", "p") == "my file|c$d|-n|"


def test_add_takes_one_word_as_a_shell_command_as_written(db):
    job = json.loads(ok(db, "add", "--json", "--", "make -j4 && make install"))
    assert job["command"] == "make -j4 && make install" and job["state"] == "pending"
    assert json.loads(ok(db, "add", "--json", "ls", "-la", "--queue", "x"))["command"] == "ls -la --queue x"


def test_add_options_are_the_job_fields(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    ok(db, "add", "--id", "first", "--", "true")
    job = json.loads(ok(db, "add", "--json", "--id", "j", "--queue", "q1", "--priority", "5", "--max-retries", "7",
                        "--timeout", "2m", "--delay", "1h", "--depends-on", "first", "--depends-on", "first",
                        "--env", "A=1", "--env", "B=x=y", "--cwd", "sub", "--", "echo", "hi"))
    assert {k: job[k] for k in ("id", "queue", "priority", "max_retries", "timeout", "env", "cwd", "waiting_on")} == {
        "id": "j", "queue": "q1", "priority": 5, "max_retries": 7, "timeout": 120, "env": {"A": "1", "B": "x=y"},
        "cwd": str(tmp_path / "sub"), "waiting_on": 1}
    assert delay_of(job) == pytest.approx(3600, abs=0.01)
    assert json.loads(ok(db, "show", "j", "--json"))["depends_on"] == ["first"]
    at = json.loads(ok(db, "add", "--json", "--run-at", "2000000000", "--", "true"))
    assert parse_iso(at["next_run_at"]).timestamp() == 2_000_000_000
    iso_at = json.loads(ok(db, "add", "--json", "--run-at", "2033-05-18T03:33:20+00:00", "--", "true"))
    assert parse_iso(iso_at["next_run_at"]).timestamp() == 2_000_000_000


@sqlite_only
@pytest.mark.parametrize("args,fragments", [
    ((), ("add", "--")), (("--",), ("add", "--")), (("--env", "A", "--", "true"), ("NAME=VALUE", "'A'")),
    (("--env", "A=1", "--env", "A=2", "--", "true"), ("A", "twice")), (("--priority", "x", "--", "true"), ("'x'",)),
    (("--delay", "5m", "--run-at", "2030-01-01T00:00", "--", "true"), ("run_at", "delay")),
    (("--id", "keep", "--", "true"), ("keep", "exists")), (("--depends-on", "nope", "--", "true"), ("nope",)),
    (("--queue", "a b", "--", "true"), ("'a b'",)), (("--", " "), ("blank",))])
def test_add_refuses_bad_input_like_enqueue_and_changes_nothing(seeded_db, args, fragments):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "add", *args)
    assert code in (1, 2) and out == "", (code, out, err)
    assert_one_error(err, *fragments)
    assert snapshot(seeded_db) == before


def test_a_one_job_enqueue_with_a_taken_id_on_postgresql_leaves_the_connection_usable(pg_url):
    """The pipelined enqueue: the duplicate is found inside the transaction and rolled back."""
    store = queuectl.PostgresStore(pg_url)
    try:
        store.enqueue([spec("a")], T0)
        with pytest.raises(queuectl.Conflict, match="'a' already exists"):
            store.enqueue([spec("b"), spec("a")], T0)
        assert store.conn.info.transaction_status == store.psycopg.pq.TransactionStatus.IDLE
        assert store.enqueue([spec("c")], T0) == ["c"]
        assert [job.id for job in store.list_jobs()] == ["a", "c"]
    finally:
        store.close()


# ---- batch enqueue (enqueue -) -------------------------------------------------------------------

def copy_batch(*objects, filler=queuectl.PG_COPY_MIN_ROWS):
    """JSON Lines of `filler` plain jobs, then the objects: big enough that PostgreSQL inserts the
    plain jobs with COPY (whose text format must escape tabs, newlines and backslashes)."""
    return jsonl(*({"id": f"f{n}", "command": "true"} for n in range(filler)), *objects)


def quick_validate(obj, defaults=None, cwd="/tmp", now=T0):
    """(what job_validator made of obj, or its error) beside (the same from validate_job); ids drawn at
    random compared by shape."""
    def run(validate):
        try:
            spec = validate(obj)
        except queuectl.UsageError as e:
            return ("error", str(e))
        if "id" not in (obj if isinstance(obj, dict) else {}):
            assert re.fullmatch(r"[0-9a-f]{16}", spec.pop("id"))
        return spec
    defaults = defaults or {"max_retries": 3, "job_timeout": 0}
    return (run(queuectl.job_validator(defaults, cwd, now)),
            run(lambda o: queuectl.validate_job(o, defaults, cwd, now)))


@pytest.fixture
def streamed(monkeypatch):
    """`enqueue -` tries the streamed path (PostgreSQL's COPY as it validates) from two lines on."""
    monkeypatch.setattr(queuectl, "BATCH_STREAM_LINES", 2)


def test_batch_of_json_lines_prints_ids_in_order(db):
    data = jsonl({"id": "b1", "command": "echo 1"}, {"command": "echo 2", "priority": 3},
                 {"id": "b3", "command": "echo 3", "queue": "q"})
    code, out, err = cli(db, "enqueue", "-", stdin=data + "\n")  # a trailing blank line is fine
    assert code == 0, err
    ids = out.splitlines()
    assert len(ids) == 3 and ids[0] == "b1" and ids[2] == "b3"
    assert re.fullmatch(r"[0-9a-f]{16}", ids[1])
    assert list_ids(db) == ids
    assert get_job(db, ids[1])["priority"] == 3 and get_job(db, "b3")["queue"] == "q"


def test_batch_as_one_json_array(db):
    data = '  \n[{"id": "a1", "command": "true"},\n {"id": "a2", "command": "true", "delay": 60}]\n'
    code, out, err = cli(db, "enqueue", "-", stdin=data)
    assert (code, out) == (0, "a1\na2\n"), err
    assert list_ids(db) == ["a1", "a2"]


def test_batch_json_prints_the_job_objects(db):
    code, out, err = cli(db, "enqueue", "-", "--json", stdin=jsonl({"id": "x", "command": "true"},
                                                                  {"id": "y", "command": "true"}))
    assert code == 0, err
    jobs = json.loads(out)
    assert [j["id"] for j in jobs] == ["x", "y"] and all(j["state"] == "pending" for j in jobs)


def test_batch_dependency_on_an_earlier_job_of_the_same_batch(db):
    data = jsonl({"id": "first", "command": "true"}, {"id": "second", "command": "true", "depends_on": ["first"]},
                 {"id": "third", "command": "true", "depends_on": ["first", "second"]})
    assert cli(db, "enqueue", "-", stdin=data)[:2] == (0, "first\nsecond\nthird\n")
    assert get_job(db, "third")["waiting_on"] == 2 and get_job(db, "third")["depends_on"] == ["first", "second"]


@sqlite_only
@pytest.mark.parametrize("bad", [case[1] for case in BAD_BATCH_LINE], ids=[case[0] for case in BAD_BATCH_LINE])
def test_batch_with_an_invalid_line_stores_nothing_and_names_the_line(seeded_db, bad):
    before = snapshot(seeded_db)
    data = _j(id="good", command="true") + "\n\n" + bad + "\n" + _j(id="after", command="true") + "\n"
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (2, ""), err
    assert_one_error(err, "line 3")
    assert snapshot(seeded_db) == before


@sqlite_only
def test_batch_array_with_an_invalid_item_names_it(seeded_db):
    before = snapshot(seeded_db)
    data = json.dumps([{"id": "good", "command": "true"}, {"id": "bad", "command": ""}])
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (2, "")
    assert_one_error(err, "2")
    assert snapshot(seeded_db) == before


@sqlite_only
def test_batch_array_item_that_is_a_string_is_refused_naming_it(seeded_db):
    before = snapshot(seeded_db)
    data = json.dumps([{"id": "good", "command": "true"}, json.dumps({"id": "s", "command": "true"})])
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (2, "")
    assert_one_error(err, "item 2", "JSON object")
    assert snapshot(seeded_db) == before


@sqlite_only
@pytest.mark.parametrize("data", [b'{"id": "a", "command": "true"}\n{"id": "b", "command": "echo \xff"}\n',
                                  b'\xfe\xff[]', b'[{"id": "a", "command": "true"}]\xc3'],
                         ids=["jsonl", "bom-like", "array-truncated-char"])
def test_batch_that_is_not_utf8_exits_2(seeded_db, data):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (2, "")
    assert_one_error(err, "UTF-8")
    assert snapshot(seeded_db) == before


@sqlite_only
def test_batch_with_an_id_twice_exits_2_naming_the_line(seeded_db):
    before = snapshot(seeded_db)
    data = _j(id="dup", command="true") + "\n\n" + _j(id="other", command="true") + "\n" + \
        _j(id="dup", command="false") + "\n"
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (2, "")
    assert_one_error(err, "dup", "line 4")
    assert snapshot(seeded_db) == before


def test_batch_with_an_id_already_in_the_db_exits_1_storing_nothing(seeded_db):
    before = snapshot(seeded_db)
    data = jsonl({"id": "new1", "command": "true"}, {"id": "keep", "command": "true"},
                 {"id": "new2", "command": "true"})
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (1, "")
    assert_one_error(err, "'keep'")
    assert "new1" not in err  # the error names the id that is taken, not one of the new ones
    assert snapshot(seeded_db) == before


def test_batch_with_an_id_already_in_the_db_after_a_dependency_exits_1(seeded_db):
    before = snapshot(seeded_db)
    data = jsonl({"id": "n1", "command": "true"}, {"id": "n2", "command": "true", "depends_on": ["n1"]},
                 {"id": "keep", "command": "true"})
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (code, out) == (1, "")
    assert_one_error(err, "keep")
    assert snapshot(seeded_db) == before


def test_batch_dependency_on_a_later_job_fails_naming_the_line(seeded_db):
    before = snapshot(seeded_db)
    data = jsonl({"id": "x", "command": "true"}, {"id": "y", "command": "true", "depends_on": ["z"]},
                 {"id": "z", "command": "true"})
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert code in (1, 2) and out == ""  # a forward reference could form a cycle: refused
    assert_one_error(err, "'z'", "line 2")
    assert snapshot(seeded_db) == before


@sqlite_only
def test_batch_dependency_on_itself_exits_2(seeded_db):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, "enqueue", "-", stdin=jsonl({"id": "me", "command": "true",
                                                                 "depends_on": ["me"]}))
    assert (code, out) == (2, "")
    assert_one_error(err, "me")
    assert snapshot(seeded_db) == before


@sqlite_only
def test_batch_that_is_json_but_not_an_array_or_lines_exits_2(seeded_db):
    before = snapshot(seeded_db)
    for data in ('[{"command": "true"}', '"just a string"', "[1, 2]"):
        code, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
        assert (code, out) == (2, ""), data
        assert_one_error(err)
    assert snapshot(seeded_db) == before


def test_batch_with_a_byte_order_mark(db):
    code, out, err = cli(db, "enqueue", "-", stdin='\ufeff{"id": "bom", "command": "true"}\n'.encode())
    assert (code, out, err) == (0, "bom\n", "")


def test_batch_lines_end_only_at_newline(db):
    """JSON allows a raw U+2028 or U+0085 inside a string: it must not split the line."""
    data = '{"id": "sep", "command": "echo a\u2028b\u0085c"}\r\n'.encode()
    assert cli(db, "enqueue", "-", stdin=data)[:2] == (0, "sep\n")
    assert get_job(db, "sep")["command"] == "echo a\u2028b\u0085c"


def test_batch_enqueue_through_a_pipe(db):
    ids = [f"j{i:05d}" for i in range(5000)]
    data = "".join(json.dumps({"id": i, "command": "true"}) + "\n" for i in ids).encode()
    result = script_stdin(db, data, "enqueue", "-")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ids
    array = json.dumps([{"id": "arr1", "command": "true"}, {"id": "arr2", "command": "true"}]).encode()
    result = script_stdin(db, array, "enqueue", "-")
    assert (result.returncode, result.stdout) == (0, "arr1\narr2\n"), result.stderr
    bad = b'{"id": "u1", "command": "true"}\n{"id": "u2", "command": "echo \xff"}\n'
    result = script_stdin(db, bad, "enqueue", "-")
    assert (result.returncode, result.stdout) == (2, "")
    assert_one_error(result.stderr)
    assert json.loads(ok(db, "status", "--json"))["jobs"]["pending"] == 5002


def test_batch_from_a_terminal_says_it_reads_until_ctrl_d(db):
    reading = "queuectl: note: reading jobs, one JSON object a line, until Ctrl-D\n"
    for typed, printed, notes in ((b'{"id": "t1", "command": "true"}\n\x04', b"t1\n", [reading]),
                                  (b"\x04", b"", [reading, "queuectl: note: no jobs read\n"])):
        terminal, stdin = os.openpty()
        proc = subprocess.Popen([sys.executable, QUEUECTL, "--db", db, "enqueue", "-"], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        os.close(stdin)
        err = LineReader(proc.stderr)
        wait_for(lambda: err.lines, "the note, before anything is typed")
        os.write(terminal, typed)  # Ctrl-D at the start of a line: the end of input
        assert proc.wait(timeout=WAIT_S) == 0
        os.close(terminal)
        err.thread.join(WAIT_S)
        assert (proc.stdout.read(), err.lines) == (printed, notes)
    assert list_ids(db) == ["t1"]


@pytest.mark.parametrize("data", ["", "\n\n", "[]"])
def test_batch_of_no_jobs_stores_nothing_and_says_so(db, data):
    assert cli(db, "enqueue", "-", stdin=data) == (0, "", "queuectl: note: no jobs read\n")
    assert cli(db, "enqueue", "-", "--json", stdin=data) == (0, "[]\n", "queuectl: note: no jobs read\n")
    assert list_ids(db) == []


def test_a_big_batch_stores_every_character_of_commands_env_and_cwd_as_given(db):
    hostile = [{"id": f"h{i}-日本\\", "command": f"printf '%s' {text!r}", "cwd": f"/tmp/{text}",
                "env": {"V": text, f"K_{i}": f"{text}={text}"}} for i, text in enumerate(HOSTILE_TEXT)]
    code, out, err = cli(db, "enqueue", "-", stdin=copy_batch(*hostile))
    assert code == 0, err
    assert out.splitlines()[-len(hostile):] == [h["id"] for h in hostile]
    for h in hostile:
        job = get_job(db, h["id"])
        assert (job["command"], job["cwd"], job["env"], job["state"]) == (h["command"], h["cwd"], h["env"], "pending")
    assert json.loads(ok(db, "status", "--json"))["jobs"]["pending"] == queuectl.PG_COPY_MIN_ROWS + len(hostile)


def test_a_big_batch_with_an_id_already_taken_exits_1_naming_it_and_stores_nothing(db):
    enqueue(db, id="old", command="true")
    before = snapshot(db)
    for position in ("first", "last"):
        taken = {"id": "old", "command": "true"}
        data = jsonl(taken) + copy_batch() if position == "first" else copy_batch(taken)
        code, out, err = cli(db, "enqueue", "-", stdin=data)
        assert (code, out) == (1, ""), err
        line = 1 if position == "first" else queuectl.PG_COPY_MIN_ROWS + 1
        assert_one_error(err, f"line {line}", "'old'", "already exists")
        assert snapshot(db) == before


def test_a_big_batch_with_an_id_twice_exits_2_and_stores_nothing(db):
    before = snapshot(db)
    code, out, err = cli(db, "enqueue", "-", stdin=copy_batch({"id": "f7", "command": "true"}))
    assert (code, out) == (2, "")
    assert_one_error(err, f"line {queuectl.PG_COPY_MIN_ROWS + 1}", "'f7'", "twice")
    assert snapshot(db) == before


def test_a_big_batch_with_dependencies_inside_it_and_on_existing_jobs(db):
    enqueue(db, id="old", command="true")
    data = copy_batch({"id": "d1", "command": "true", "depends_on": ["f3"]},
                      {"id": "d2", "command": "true", "depends_on": ["old", "d1", "f99"]}) + \
        jsonl(*({"id": f"g{n}", "command": "true"} for n in range(queuectl.PG_COPY_MIN_ROWS)))
    code, out, err = cli(db, "enqueue", "-", stdin=data)
    assert code == 0, err
    assert len(out.splitlines()) == 2 * queuectl.PG_COPY_MIN_ROWS + 2
    d1, d2 = get_job(db, "d1"), get_job(db, "d2")
    assert (d1["waiting_on"], d1["depends_on"]) == (1, ["f3"])
    assert (d2["waiting_on"], d2["depends_on"]) == (3, ["old", "d1", "f99"])
    counts = json.loads(ok(db, "status", "--json"))["jobs"]
    assert counts["pending"] == 1 + 2 * queuectl.PG_COPY_MIN_ROWS + 2


def test_a_big_batch_with_a_missing_dependency_after_copied_jobs_stores_nothing(db):
    before = snapshot(db)
    data = copy_batch({"id": "d1", "command": "true", "depends_on": ["nowhere"]})
    code, out, err = cli(db, "enqueue", "-", stdin=data)
    assert (code, out) == (1, "")
    assert_one_error(err, f"line {queuectl.PG_COPY_MIN_ROWS + 1}", "'nowhere'", "does not exist")
    assert snapshot(db) == before


@pytest.mark.parametrize("obj", [
    {"command": "true"}, {"command": "echo é"}, {"command": " "}, {"command": ""}, {"command": "a\0b"},
    {"command": 3}, {"command": "x" * (queuectl.MAX_COMMAND_BYTES + 1)}, {"command": "x" * queuectl.MAX_COMMAND_BYTES},
    {"command": "true", "id": "j-1"}, {"command": "true", "id": ""}, {"command": "true", "id": "a\tb"},
    {"command": "true", "id": "a\u2028b"}, {"command": "true", "id": None}, {"command": "true", "id": 7},
    {"command": "true", "id": "x" * (queuectl.MAX_ID_CHARS + 1)}, {"command": "true", "priority": 5},
    {"command": "true", "priority": True}, {"command": "true", "priority": 1.0},
    {"command": "true", "priority": queuectl.MAX_PRIORITY + 1}, {"command": "true", "priority": -queuectl.MAX_PRIORITY},
    {"command": "true", "queue": "q.1"}, {"command": "true", "queue": "a b"}, {"command": "true", "queue": ["q"]},
    {"command": "true", "queue": None}, {"id": "x"}, {"command": "true", "colour": "red"},
    {"command": "true", "delay": "5m"}, {"command": "true", "env": {"A": "1"}}, ["true"], "true",
])
def test_job_validator_says_what_validate_job_says(obj):
    quick, full = quick_validate(obj)
    assert quick == full


def test_job_validator_where_a_default_is_invalid_says_it_for_each_job():
    # The current folder is gone: a job without a cwd is refused, one that names its own is not.
    quick, full = quick_validate({"command": "true"}, cwd="")
    assert quick == full and quick[0] == "error" and "current folder" in quick[1]
    quick, full = quick_validate({"command": "true", "cwd": "/tmp"}, cwd="")
    assert quick == full and quick["cwd"] == "/tmp"


def test_job_validator_draws_different_ids():
    validate = queuectl.job_validator({"max_retries": 3, "job_timeout": 0}, "/tmp", T0)
    ids = [validate({"command": "true"})["id"] for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)


def test_batch_lines_with_blanks_crlf_and_spaces_parse_as_before(db):
    data = '{"id": "a", "command": "true"}\r\n  {"id": "b", "command": "true"}  \n\n\t\n{"id":"c","command":"true"}'
    assert cli(db, "enqueue", "-", stdin=data)[:2] == (0, "a\nb\nc\n")
    code, out, err = cli(db, "enqueue", "-", stdin='{"id": "d", "command": "true"} {"id": "e"}\n')
    assert (code, out) == (2, "")
    assert_one_error(err, "line 1", "invalid JSON")
    code, out, err = cli(db, "enqueue", "-", stdin='{"id": "d", "id": "e", "command": "true"}\n')
    assert (code, out) == (2, "")
    assert_one_error(err, "line 1", "duplicate key 'id'")


def test_streamed_batch_stores_what_the_usual_path_stores(db, streamed):
    data = jsonl({"id": "s1", "command": "echo 1", "priority": 2}, {"command": "echo 2", "queue": "q"},
                 {"id": "s3", "command": "echo 3", "delay": 60, "env": {"A": "b\tc"}})
    code, out, err = cli(db, "enqueue", "-", stdin=data)
    assert code == 0, err
    ids = out.splitlines()
    assert ids[0] == "s1" and ids[2] == "s3" and list_ids(db) == ids
    assert get_job(db, "s1")["priority"] == 2 and get_job(db, ids[1])["queue"] == "q"
    assert get_job(db, "s3")["env"] == {"A": "b\tc"} and get_job(db, "s3")["state"] == "pending"


def test_postgres_streams_a_big_batch_without_the_usual_insert(pg_url, streamed, monkeypatch):
    # Proof that the streamed path stored it: the usual one would fail.
    def usual(*args, **kwargs):
        raise AssertionError("the usual path ran")
    monkeypatch.setattr(queuectl.Store, "enqueue", usual)
    data = jsonl(*({"id": f"p{n}", "command": "true"} for n in range(50)))
    code, out, err = cli(pg_url, "enqueue", "-", stdin=data)
    assert (code, len(out.splitlines())) == (0, 50), err
    monkeypatch.undo()
    assert json.loads(ok(pg_url, "status", "--json"))["jobs"]["pending"] == 50


@pytest.mark.parametrize("lines,code,names", STREAMED_FAILURES, ids=[str(n) for n in range(len(STREAMED_FAILURES))])
def test_streamed_batch_fails_as_the_usual_path_and_stores_nothing(seeded_db, streamed, lines, code, names):
    before = snapshot(seeded_db)
    data = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    got, out, err = cli(seeded_db, "enqueue", "-", stdin=data)
    assert (got, out) == (code, ""), err
    assert_one_error(err, *names)
    assert snapshot(seeded_db) == before


def test_streamed_batch_with_dependencies_takes_the_usual_path(db, streamed):
    data = jsonl({"id": "a", "command": "true"}, {"id": "b", "command": "true"},
                 {"id": "c", "command": "true", "depends_on": ["a", "b"]})
    assert cli(db, "enqueue", "-", stdin=data)[:2] == (0, "a\nb\nc\n")
    assert get_job(db, "c")["depends_on"] == ["a", "b"] and get_job(db, "c")["waiting_on"] == 2
    assert json.loads(ok(db, "status", "--json"))["jobs"]["pending"] == 3


def test_a_batch_of_many_long_jobs_led_by_a_taken_id_names_it_and_stores_nothing(db):
    """Up to 99 jobs go in with executemany, pipelined on PostgreSQL: the server's refusal of the first
    (its id taken) comes back while the others are still being sent, and must be reported as that id."""
    enqueue(db, id="keep", command="true")
    before = snapshot(db)
    jobs = [{"id": "keep", "command": "true"}] + [{"id": f"new{i}", "command": "x" * 2000} for i in range(98)]
    code, out, err = cli(db, "enqueue", "-", stdin=jsonl(*jobs))
    assert (code, out) == (1, "")
    assert_one_error(err, "'keep'", "already exists")
    assert snapshot(db) == before


# ---- list, status, show and logs -----------------------------------------------------------------

def a_job(**fields):
    base = {"id": "j", "command": "true", "state": "pending", "attempts": 0, "max_retries": 3, "timeout": 0.0,
            "cwd": "/", "env": {}, "created_at": T0, "updated_at": T0, "next_run_at": T0, "last_error": None,
            "exit_code": None, "worker_id": None, "run_count": 0, "lost_count": 0, "priority": 0, "queue": "default",
            "waiting_on": 0}
    return queuectl.Job(**{**base, **fields})


def list_rows(db):
    """`list` as {id cell: row}, checking every row lines up with the header."""
    header, *rows = ok(db, "list").splitlines()
    starts = [header.index(name) for name in ("STATE", "ATTEMPTS", "QUEUE", "DUE", "UPDATED", "COMMAND")]
    for row in rows:
        assert all(row[i - 1] == " " and row[i] != " " for i in starts if i != starts[1]), (header, row)
    return {row.split(" ")[0]: row for row in rows}


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


@sqlite_only
@pytest.mark.parametrize("args, message", [(("list", "--limit", "-1"), "argument --limit: value '-1' must be an "
                                            "integer, 0 or more"),
                                           (("logs", "x", "--run", "0"), "argument --run: value '0' must be an "
                                            "integer, 1 or more"),
                                           (("list", "--limit", "9" * 20), f"value '{'9' * 20}' must be an integer "
                                            f"from 0 to {queuectl.UNBOUNDED}")])
def test_list_and_logs_name_a_range_without_an_upper_bound_as_readable(db, args, message):
    code, out, err = cli(db, *args)
    assert (code, out) == (2, "")
    assert_one_error(err, message)


@sqlite_only
def test_list_unknown_state_lists_the_valid_ones(ran_db):
    code, out, err = cli(ran_db, "list", "--state", "bogus")
    assert (code, out) == (2, "")
    assert "Traceback" not in err
    line = [line for line in err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(line) == 1, err
    for state in STATES:
        assert state in line[0], (state, err)


def test_status_json_shape(ran_db):
    data = json.loads(ok(ran_db, "status", "--json"))
    assert data == {"jobs": {"pending": 1, "processing": 0, "completed": 1, "failed": 0, "dead": 1},
                    "active_workers": 0, "paused": [], "paused_except": []}
    text = ok(ran_db, "status")
    for state in STATES:
        assert state in text
    assert "worker" in text.lower()


def test_status_of_an_empty_db(db):
    data = json.loads(ok(db, "status", "--json"))
    assert data == {"jobs": {state: 0 for state in STATES}, "active_workers": 0, "paused": [],
                    "paused_except": []}


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


def test_status_watch_redraws_until_ctrl_c(db, workers, tmp_path):
    enqueue(db, id="w1", command="true")
    enqueue(db, id="w2", command="true")
    out_path = tmp_path / "watch.out"
    with open(out_path, "wb") as out:
        watch = workers.spawn("status", "--watch", stdout=out)
    wait_for(lambda: out_path.read_bytes().count(b"pending") >= 2, "two redraws of the status")
    watch.send_signal(signal.SIGINT)
    assert watch.wait(timeout=WAIT_S) == 130
    text = out_path.read_text()
    assert re.search(r"pending\s+2\b", text) and re.search(r"completed\s+0\b", text), text
    assert "\x1b[2J" not in text  # redrawn in place, not cleared (no flicker)
    stderr = watch.stderr.read().decode()
    assert "Traceback" not in stderr and "error" not in stderr, stderr


def test_status_watch_started_before_the_queue_exists_shows_it_once_it_does(db, workers, tmp_path):
    out_path = tmp_path / "watch.out"
    with open(out_path, "wb") as out:
        watch = workers.spawn("status", "--watch", "--json", stdout=out)
    wait_for(lambda: out_path.read_bytes().count(b"\n") >= 1, "a first frame")
    assert json.loads(out_path.read_text().splitlines()[0])["jobs"]["pending"] == 0
    enqueue(db, id="w1", command="true")
    wait_for(lambda: '"pending": 1' in out_path.read_text(), "a frame with the job enqueued after the start")
    watch.send_signal(signal.SIGINT)
    assert watch.wait(timeout=WAIT_S) == 130
    assert watch.stderr.read().decode().startswith("queuectl: note: no queue at ")


def test_status_watch_json_prints_one_json_object_a_line(db, capsys):
    enqueue(db, id="w1", command="true")
    with opened(db) as s:
        capsys.readouterr()
        queuectl._watch_frame(s, None, True)
        queuectl._watch_frame(s, None, True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["jobs"]["pending"] == 1 for line in lines)


@pytest.mark.parametrize("fields,paused,text", [
    ({}, [], "now"), ({"next_run_at": T0 - 5}, [], "now"), ({"next_run_at": T0 + 44.2}, [], "in 45s"),
    ({"next_run_at": T0 + 230}, [], "in 4m"), ({"next_run_at": T0 + 3 * 3600 + 20 * 60}, [], "in 3h 20m"),
    ({"waiting_on": 2}, [], "after 2 jobs"), ({"waiting_on": 1, "next_run_at": T0 + 99}, [], "after 1 job"),
    ({}, ["default"], "paused"), ({}, ["*"], "paused"), ({}, ["other"], "now"), ({"state": "failed"}, [], "now"),
    ({"state": "processing"}, [], "-"), ({"state": "completed"}, [], "-"), ({"state": "dead"}, ["*"], "-")])
def test_due_text(fields, paused, text):
    assert queuectl.due_text(a_job(**fields), T0, paused) == text


def test_due_text_a_day_or_more_ahead_is_its_utc_time(local_tz):
    local_tz("Asia/Kolkata")  # UTC+05:30: not what is shown
    job = a_job(next_run_at=T0 + 2 * 86400)  # T0 is 2027-01-15T08:00:00Z
    assert queuectl.due_text(job, T0, []) == "2027-01-17T08:00:00.000Z"


def test_a_run_at_at_the_time_limit_lists_east_of_utc(local_tz, db):
    # The latest run_at queuectl takes, 9999-12-31T23:59:59Z, is already year 10000 on a clock east of UTC.
    local_tz("Asia/Tokyo")  # UTC+9
    ok(db, "add", "--id", "last", "--run-at", str(queuectl.MAX_UNIX_TIME), "--", "true")
    assert ok(db, "list").splitlines()[1].split()[4] == "9999-12-31T23:59:59.000Z"
    assert "\ndue:          9999-12-31T23:59:59.000Z\n" in ok(db, "show", "last")


def test_every_time_list_show_and_schedule_list_print_is_utc_with_a_z_whatever_the_local_zone(local_tz, db):
    local_tz("Asia/Tokyo")  # UTC+9: a local time would show 9 hours apart from the UTC ones
    ok(db, "add", "--id", "later", "--run-at", "2099-01-02T03:04:05Z", "--", "true")  # no offset: local
    ok(db, "add", "--id", "tokyo", "--run-at", "2099-01-02T12:04:05", "--", "true")
    ok(db, "schedule", "add", '{"id": "s", "cron": "30 2 * * *", "tz": "Europe/Berlin", "command": "true"}')
    header, *rows = ok(db, "list").splitlines()
    due, updated = header.index("DUE"), header.index("UPDATED")
    for row in rows:
        assert row[due:].startswith("2099-01-02T03:04:05.000Z "), row
        assert ISO_UTC.match(row[updated:].split(" ")[0]), row
    shown = dict(line.split(":", 1) for line in ok(db, "show", "tokyo").splitlines() if line[:1] != " ")
    for key in ("created_at", "updated_at", "next_run_at", "due"):
        assert ISO_UTC.match(shown[key].strip()), (key, shown)
    header, row = ok(db, "schedule", "list").splitlines()
    slot = json.loads(ok(db, "schedule", "list", "--json"))[0]["next_run_at"]
    utc_slot, wall = row[header.index("NEXT "):].split()[:2]
    assert utc_slot == queuectl.slot_text(parse_iso(slot).timestamp())  # as its job's id will end
    assert wall == parse_iso(slot).astimezone(zoneinfo.ZoneInfo("Europe/Berlin")).isoformat()  # its clock
    assert wall[11:16] == "02:30" and wall[19:] in ("+01:00", "+02:00")


@pytest.mark.parametrize("state,attempts,max_retries,shown", [
    ("completed", 0, 3, (1, 3)), ("completed", 0, 0, (1, 1)), ("completed", 2, 3, (3, 3)), ("pending", 0, 3, (0, 3)),
    ("failed", 1, 3, (1, 3)), ("processing", 1, 3, (2, 3)), ("dead", 1, 0, (1, 1)), ("dead", 3, 3, (3, 3))])
def test_attempts_shown(state, attempts, max_retries, shown):
    assert queuectl.attempts_shown(a_job(state=state, attempts=attempts, max_retries=max_retries)) == shown


def test_list_shows_due_and_attempts_aligned_with_long_ids_whole(db):
    long_id = "tick@2026-12-02T02:00:00Z-and-a-job-id-much-longer-than-twenty-characters"
    enqueue(db, id=long_id, command="true", queue="a-queue-name-longer-than-ten", delay="4m")
    enqueue(db, id="after", command="true", depends_on=[long_id])
    enqueue(db, id="once", command="true", max_retries=0)
    with opened(db) as s:
        register(s, now=time.time())
        finish_next(s, 0, time.time())  # once: completed on its first run
    rows = list_rows(db)
    assert set(rows) == {long_id, "after", "once"}  # never cut: an id in `list` can be copied into `logs`
    assert " in 4m " in rows[long_id] and " a-queue-name-longer-than-ten " in rows[long_id]
    assert " 0/3 " in rows[long_id]
    assert " after 1 job " in rows["after"]
    assert " 1/1 " in rows["once"] and " completed " in rows["once"]
    assert json.loads(ok(db, "list", "--json"))[2]["attempts"] == 0  # JSON keeps its meaning
    assert "\ndue:          after 1 job\n" in ok(db, "show", "after")


def test_list_cuts_the_command_to_a_terminals_width_and_nothing_elsewhere(db, monkeypatch):
    command = "echo " + "a-long-argument " * 20
    slot_id = "nightly-report@2026-12-02T02:00:00Z"
    enqueue(db, id=slot_id, command=command)
    monkeypatch.setenv("COLUMNS", "120")
    header, row = on_a_terminal(db, "list").splitlines()
    assert row.startswith(slot_id + " ") and len(row) == 120 and row.endswith("…"), row
    assert row[header.index("COMMAND"):].startswith("echo a-long-argument ")
    header, row = ok(db, "list").splitlines()  # to a pipe or a file: the whole command, for scripts
    assert row.startswith(slot_id + " ") and row.endswith(" " + command.strip())


def test_list_to_a_pipe_keeps_the_commands_own_blanks(db):
    # Runs of spaces and a no-break space are the command's: squeezed, it would be another command.
    command = "printf '%s|%s|' 'a   b' c\u00a0d"
    enqueue(db, id="spaced", command=command)
    assert ok(db, "list").splitlines()[1].endswith(" " + command)


@sqlite_only
@pytest.mark.parametrize("columns", ["0", "1", "abc", "-3", "9" * 20])
def test_list_on_a_terminal_takes_any_columns_value(db, monkeypatch, columns):
    # $COLUMNS of 0, 1 or no number: the terminal's own width (80 for a test's stdout); a huge one: nothing to cut.
    command = "echo " + "word " * 30
    enqueue(db, id="j", command=command)
    monkeypatch.setenv("COLUMNS", columns)
    header, row = on_a_terminal(db, "list").splitlines()
    if columns == "9" * 20:
        assert row.endswith(" " + command.strip()) and len(row) < 300, row
    else:
        assert len(row) == 80 and row.endswith("…"), row


def test_list_aligns_ids_of_wide_and_combining_characters(db):
    import unicodedata

    def columns(text):  # as a terminal draws it: CJK wide characters take two columns, combining marks none
        return sum(0 if unicodedata.combining(c) or unicodedata.category(c) == "Cf"
                   else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    for job_id in ("plain", "日本語のジョブ名前", "ｆｕｌｌｗｉｄｔｈ-ｉｄ-ｌｏｎｇ-ｏｎｅ", "e\u0301e\u0301e\u0301", "zero\u200bwidth"):
        ok(db, "add", "--id", job_id, "--", "true")
    header, *rows = ok(db, "list").splitlines()
    starts = {columns(line[:line.index(" pending ")]) for line in rows}
    assert starts == {columns(header[:header.index(" STATE ")])}, rows
    assert "…" not in "".join(rows)  # the column is as wide as the widest id: none is cut


@pytest.mark.parametrize("left,text", [(59.5, "in 1m"), (60, "in 1m"), (3590, "in 1h 0m"), (3600, "in 1h 0m"),
                                       (3 * 3600 + 20 * 60, "in 3h 20m"), (59, "in 59s"), (3540, "in 59m")])
def test_due_text_never_says_60s_or_60m(left, text):
    assert queuectl.due_text(a_job(next_run_at=T0 + left), T0, []) == text


# ---- dlq -----------------------------------------------------------------------------------------

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


def test_dlq_retry_all_of_a_queue_revives_the_chains_it_needs(db):
    dead_chain_db(db)
    assert ok(db, "dlq", "retry", "--all", "--queue", "q2") == "root\nchild\nlone\n"
    jobs = {j["id"]: j for j in json.loads(ok(db, "list", "--json"))}
    assert {i: (j["state"], j["waiting_on"]) for i, j in jobs.items()} == {
        "root": ("pending", 0), "child": ("pending", 1), "lone": ("pending", 0), "fine": ("completed", 0),
        "wait": ("pending", 0)}
    assert ok(db, "dlq", "retry", "--all") == ""  # none left: nothing printed, exit 0


def test_dlq_retry_all_revives_every_dead_job(db):
    dead_chain_db(db)
    assert ok(db, "dlq", "retry", "--all") == "root\nchild\nlone\n"
    assert ok(db, "dlq", "list", "--json") == "[]\n"
    assert ok(db, "dlq", "retry", "--all", "--queue", "default") == ""


@sqlite_only
@pytest.mark.parametrize("args", [("cancel",), ("cancel", "a", "--all"), ("cancel", "a", "--queue", "q"),
                                  ("dlq", "retry"), ("dlq", "retry", "a", "--all"), ("dlq", "retry", "--queue", "q"),
                                  ("cancel", "--all", "--queue", "a b")])
def test_bulk_commands_want_ids_or_all(seeded_db, args):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, *args)
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err and err.startswith(ERROR_PREFIX) or "usage" in err
    assert snapshot(seeded_db) == before


@sqlite_only
@pytest.mark.parametrize("command", [("cancel",), ("dlq", "retry"), ("wait",)])
def test_queue_without_all_says_queue_needs_all(seeded_db, command):
    before = snapshot(seeded_db)
    code, out, err = cli(seeded_db, *command, "--queue", "default")
    assert (code, out) == (2, "")
    name = " ".join(command)
    assert_one_error(err, f"{name}: --queue needs --all (`{name} --all --queue default`)")
    assert snapshot(seeded_db) == before


def test_postgres_dlq_retry_all_skips_what_another_command_revived_or_purged_meanwhile(pg_url):
    def retry_c_and_purge_b(other):
        other.execute("UPDATE jobs SET state = 'pending' WHERE id = 'c'")
        other.execute("DELETE FROM jobs WHERE id = 'b'")
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.enqueue([spec("a"), spec("b"), spec("c")], T0)
        s.cancel(["a", "b", "c"], T0)
        revived = while_rows_locked(s, ["b", "c"], lambda mine: mine.retry_all_dead(None, T0 + 1), retry_c_and_purge_b)
        assert revived == ["a"] and s.get("a").state == "pending"


def test_postgres_dlq_retry_all_takes_along_a_dependency_that_died_meanwhile(pg_url):
    with contextlib.closing(queuectl.PostgresStore(pg_url)) as s:
        s.enqueue([spec("dep", queue="other"), spec("job", depends_on=["dep"])], T0)
        s.cancel(["job"], T0)  # dead; dep still pending, until its last run fails while the retry waits
        revived = while_rows_locked(s, ["job"], lambda mine: mine.retry_all_dead("default", T0 + 1),
                                    lambda other: other.execute("UPDATE jobs SET state = 'dead' WHERE id = 'dep'"))
        assert revived == ["job", "dep"]
        assert [s.get(i).state for i in ("job", "dep")] == ["pending", "pending"]


# ---- wait and wait --all -------------------------------------------------------------------------

def after_snapshot(monkeypatch, action):
    """Make an in-process `wait --all` run `action()` right after it has read which jobs it answers for
    (instead of any action set before)."""
    def spy(self, queue):
        found = UNFINISHED(self, queue)
        action()
        return found
    monkeypatch.setattr(queuectl.Store, "unfinished", spy)


def test_wait_exits_0_when_every_job_completed(states_db):
    enqueue(states_db, id="done2", command="true")
    with opened(states_db) as s:
        register(s, now=time.time())
        assert finish_next(s, 0, time.time()).id in ("done2", "wait")
        finish_next(s, 0, time.time())
        s.deregister("w1")
    assert cli(states_db, "wait", "done", "done2", "wait") == (0, "", "")


@pytest.mark.parametrize("ids", [["gone"], ["done", "gone"], ["gone", "done"]])
def test_wait_exits_1_if_any_job_is_dead(states_db, ids):
    code, out, err = cli(states_db, "wait", *ids)
    assert (code, out) == (1, "")
    assert_one_error(err, "gone")


def test_wait_with_a_dead_job_still_waits_for_the_others(states_db):
    # "blocks until every named job is completed or dead": a dead one does not end the wait early.
    started = time.monotonic()
    code, out, err = cli(states_db, "wait", "gone", "wait", "--timeout", "0.3")
    assert time.monotonic() - started >= 0.3
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out waiting for wait")
    ok(states_db, "cancel", "wait")
    code, out, err = cli(states_db, "wait", "gone", "wait")
    assert (code, out) == (1, "")
    assert_one_error(err, "'gone'")
    assert "'wait': canceled" in err


def test_wait_exits_1_on_timeout(states_db):
    started = time.monotonic()
    code, out, err = cli(states_db, "wait", "done", "wait", "--timeout", "0.3")
    assert time.monotonic() - started >= 0.3
    assert (code, out) == (1, "")
    assert_one_error(err, "wait")
    assert get_job(states_db, "wait")["state"] == "pending"


def test_wait_for_an_unknown_job_exits_1(states_db):
    code, out, err = cli(states_db, "wait", "done", "missing")
    assert (code, out) == (1, "")
    assert_one_error(err, "missing")


@sqlite_only
@pytest.mark.parametrize("timeout", ["-1", "abc", "nan", "inf"])
def test_wait_bad_timeout_exits_2(states_db, timeout):
    code, out, err = cli(states_db, "wait", "done", "--timeout", timeout)
    assert_argparse_error(code, err)


def test_wait_says_once_when_no_live_worker_serves_the_queue_and_keeps_waiting(db, workers, monkeypatch):
    monkeypatch.setattr(queuectl, "WAIT_NO_WORKER_S", 0.2)  # the wait's --timeout is its deadline
    enqueue(db, id="j", command="true")
    enqueue(db, id="k", command="true", queue="images")
    enqueue(db, id="later", command="true", delay="1h")
    code, out, err = cli(db, "wait", "j", "--timeout", "1")
    assert (code, out) == (1, "")  # it waited on, to the deadline
    assert err.splitlines()[:1] == [
        "queuectl: note: no live worker serves queue 'default': start one with queuectl worker start"]
    assert_one_error("\n".join(err.splitlines()[1:]), "timed out waiting for j")
    workers.start("--queue", "other").wait_log("worker started")
    code, out, err = cli(db, "wait", "j", "k", "--timeout", "1")
    assert err.startswith("queuectl: note: no live worker serves queues 'default', 'images': start one")
    workers.start("--queue", "default").wait_log("worker started")
    code, out, err = cli(db, "wait", "later", "--timeout", "1")
    assert code == 1
    assert_one_error(err, "timed out waiting for later")  # a worker serves it: nothing more to say


def test_wait_says_so_when_the_worker_running_the_job_died_and_no_live_worker_serves_its_queue(db, monkeypatch):
    # Only a live worker of its queue takes a dead worker's job back: until one starts it stays processing.
    monkeypatch.setattr(queuectl, "WAIT_NO_WORKER_S", 0.2)  # the wait's --timeout is its deadline
    with opened(db) as s:
        register(s, "gone", now=s.now() - 3600)  # on another host, silent for an hour: dead
        s.enqueue([spec("j")], s.now())
        assert s.claim("gone", s.now()).id == "j"
    code, out, err = cli(db, "wait", "j", "--timeout", "1")
    assert (code, out) == (1, "")
    assert err.splitlines()[:1] == [
        "queuectl: note: no live worker serves queue 'default': start one with queuectl worker start"]


def test_wait_blocks_until_the_worker_finishes_the_jobs(db, workers, tmp_path):
    enqueue(db, id="long", command=BLOCKING_JOB, cwd=str(tmp_path))
    enqueue(db, id="quick", command="true", cwd=str(tmp_path))
    waiter = workers.spawn("wait", "long", "quick")
    workers.start("--count", "2")
    _wait_started(tmp_path)
    wait_for(lambda: state_of(db, "quick") == "completed", "the quick job")
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert waiter.poll() is None, waiter.stderr.read()
        time.sleep(0.05)
    (tmp_path / "release").touch()
    assert waiter.wait(timeout=WAIT_S) == 0, waiter.stderr.read()


@pytest.mark.parametrize("job, expected", [({"command": "true"}, 0), ({"command": "exit 3", "max_retries": 0}, 1)],
                         ids=["completes", "dies"])
def test_enqueue_then_wait_in_a_shell_script(db, workers, tmp_path, job, expected):
    workers.start()
    q = f"{shlex.quote(sys.executable)} {shlex.quote(QUEUECTL)} --db {shlex.quote(db)}"
    line = f"id=$({q} enqueue {shlex.quote(json.dumps({**job, 'cwd': str(tmp_path)}))}) && {q} wait \"$id\""
    result = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=WAIT_S,
                            env=child_env(**{TAG_VAR: workers.tag}))
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr


def test_wait_all_on_a_queue_with_nothing_unfinished_exits_0_at_once(db):
    code, out, err = cli(db, "wait", "--all")  # no queue yet: as an empty one, with a note
    assert (code, out) == (0, "") and err.startswith("queuectl: note: no queue at "), err
    ok(db, "config", "set", "max-retries", "3")
    assert cli(db, "wait", "--all") == (0, "", "")
    enqueue(db, id="old", command="true")
    ok(db, "cancel", "old")  # dead before the wait started: not one of the jobs it answers for
    assert finish_due(db) == []
    assert cli(db, "wait", "--all") == (0, "", "")


@sqlite_only
@pytest.mark.parametrize("args, fragment", [(["--all", "a"], "not both"), ([], "--all"),
                                            (["a", "--queue", "q"], "--queue needs --all"),
                                            (["--all", "--queue", "bad name"], "queue")])
def test_wait_all_bad_arguments_exit_2_and_create_nothing(db, args, fragment):
    code, out, err = cli(db, "wait", *args)
    assert (code, out) == (2, "")
    assert fragment in err and "Traceback" not in err
    assert not os.path.exists(db)


def test_wait_all_blocks_until_a_queue_drains(db, workers, tmp_path, monkeypatch):
    for n in range(3):
        enqueue(db, id=f"j{n}", command="true", cwd=str(tmp_path))
    code, out, err = cli(db, "wait", "--all", "--timeout", "0.3")
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out: 3 jobs still pending, failed or processing")
    burst = []
    after_snapshot(monkeypatch, lambda: burst.append(workers.start("--burst")))  # a real worker drains it
    assert cli(db, "wait", "--all") == (0, "", "")
    assert [state_of(db, f"j{n}") for n in range(3)] == ["completed"] * 3
    assert burst[0].wait() == 0


def test_wait_all_exits_1_naming_a_job_that_went_dead(db, workers, tmp_path, monkeypatch):
    enqueue(db, id="good", command="true", cwd=str(tmp_path))
    enqueue(db, id="bad", command="exit 3", max_retries=0, cwd=str(tmp_path))
    after_snapshot(monkeypatch, lambda: workers.start("--burst"))
    code, out, err = cli(db, "wait", "--all")
    assert (code, out) == (1, "")
    assert_one_error(err, "1 of the 2 jobs waited for ended dead: 'bad'")
    assert (state_of(db, "good"), state_of(db, "bad")) == ("completed", "dead")


def test_wait_all_names_at_most_ten_dead_jobs(db, monkeypatch):
    ids = [f"d{n:02d}" for n in range(12)]
    for job_id in ids:
        enqueue(db, id=job_id, command="true")
    after_snapshot(monkeypatch, lambda: ok(db, "cancel", *ids))
    code, out, err = cli(db, "wait", "--all")
    assert (code, out) == (1, "")
    assert_one_error(err, "12 of the 12 jobs waited for ended dead: 'd00', 'd01'", "'d09' and 2 more")
    assert "'d10'" not in err and "'d11'" not in err


def test_wait_all_counts_a_job_scheduled_for_later_as_unfinished(db):
    enqueue(db, id="now", command="true")
    enqueue(db, id="later", command="true", delay=3600)
    assert finish_due(db) == ["now"]
    code, out, err = cli(db, "wait", "--all", "--timeout", "0.3")
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out: 1 job still pending, failed or processing")


def test_wait_all_waits_for_jobs_enqueued_meanwhile_but_answers_only_for_the_first(db, monkeypatch):
    enqueue(db, id="early", command="true")

    def meanwhile():
        enqueue(db, id="late", command="true")
        with opened(db) as s:
            s.cancel(["late"], time.time())  # a job it did not answer for ends dead ...
        enqueue(db, id="later", command="true")  # ... and one more arrives, still pending
        assert finish_due(db) == ["early", "later"]
    after_snapshot(monkeypatch, meanwhile)
    assert cli(db, "wait", "--all") == (0, "", "")
    assert [state_of(db, i) for i in ("early", "late", "later")] == ["completed", "dead", "completed"]


def test_wait_all_queue_waits_for_that_queue_only(db, monkeypatch):
    enqueue(db, id="a1", command="true", queue="a")
    enqueue(db, id="b1", command="true", queue="b")
    enqueue(db, id="b2", command="true", queue="b")
    code, out, err = cli(db, "wait", "--all", "--queue", "b", "--timeout", "0.3")
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out: 2 jobs in queue 'b' still pending, failed or processing")

    def settle():
        ok(db, "cancel", "b1")  # dead, but in another queue than the one waited for
        with opened(db) as s:
            register(s, "tw", now=time.time())
            job = s.claim("tw", time.time(), ("a",))
            s.finish(job, "tw", outcome(0, None, "", 0.0), SETTINGS, time.time())
    after_snapshot(monkeypatch, settle)
    assert cli(db, "wait", "--all", "--queue", "a") == (0, "", "")
    assert state_of(db, "a1") == "completed"
    after_snapshot(monkeypatch, lambda: None)
    code, out, err = cli(db, "wait", "--all", "--timeout", "0.3")  # b2 is still pending
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out: 1 job still")


def test_wait_ids_keeps_its_contract_next_to_all(db):
    enqueue(db, id="p", command="true")
    code, out, err = cli(db, "wait", "p", "--timeout", "0.3")
    assert (code, out) == (1, "")
    assert_one_error(err, "timed out waiting for p")
    finish_due(db)
    assert cli(db, "wait", "p") == (0, "", "")


def test_wait_all_on_a_terminal_reads_a_big_dlq_for_its_line_only_now_and_then(store, monkeypatch):
    # The line's dead count reads the dead jobs among those waited for; with a big DLQ (200,000 dead
    # jobs take some 0.3 s to read here) reading it at every poll kept a core busy for as long as the
    # wait lasted. Here each read of the dead "takes" a second of the line's clock, a poll a quarter.
    register(store, "me")
    store.enqueue([spec("a"), spec("b", max_retries=0)], T0)
    clock, polls, reads = [0.0], [], []
    real_counts, real_dead = store.wait_counts, store.dead_between

    def wait_counts(queue, after_seq):
        clock[0] += 0.25
        polls.append(clock[0])
        return (0, 0) if len(polls) > 12 else real_counts(queue, after_seq)

    def dead_between(*args):
        clock[0] += 1.0
        reads.append(clock[0])
        return real_dead(*args)
    monkeypatch.setattr(store, "wait_counts", wait_counts)
    monkeypatch.setattr(store, "dead_between", dead_between)
    monkeypatch.setattr(queuectl, "WAIT_POLL_S", 0.001)
    progress = queuectl.Progress(True, io.StringIO(), clock=lambda: clock[0])
    assert queuectl.wait_all(store, None, None, progress) == 0
    assert len(polls) == 13 and len(reads) == 2  # one for the line, then the verdict's own


def test_wait_all_counts_only_jobs_enqueued_after_its_start_when_nothing_was_unfinished(store, monkeypatch):
    """With nothing unfinished at the start, the highest seq was read as 0, so every finished job in
    the table counted as "enqueued meanwhile": the line said 3/4 for the one job that arrived."""
    register(store, "me")
    store.enqueue([spec("old1"), spec("old2"), spec("old3")], T0)
    for _ in range(3):
        store.finish(store.claim("me", T0), "me", outcome(0, None, "", 0.0), SETTINGS, T0)
    assert store.unfinished(None)[0] == set()
    lines, polls = [], []

    class Line(queuectl.Progress):
        def show(self, text):
            lines.append(text)
    real_counts = store.wait_counts

    def wait_counts(queue, after_seq):
        polls.append(after_seq)
        if len(polls) == 1:
            store.enqueue([spec("new")], T0)  # arrives after the snapshot
        return (0, 0) if len(polls) > 1 else real_counts(queue, after_seq)
    monkeypatch.setattr(store, "wait_counts", wait_counts)
    monkeypatch.setattr(queuectl, "WAIT_POLL_S", 0.001)
    assert queuectl.wait_all(store, None, None, Line(True, io.StringIO())) == 0
    assert lines and lines[0].startswith("waiting: 0/1 finished, 0 dead")


# ---- the progress line, on a terminal and off one ------------------------------------------------

def batch_file(folder, lines):
    path = folder / f"batch{lines}.jsonl"
    path.write_text("".join(json.dumps({"id": f"b{n}", "command": "true"}) + "\n" for n in range(lines)))
    return path


def test_screen_follows_carriage_returns_and_erases():
    assert screen("\rwaiting: 1/2\x1b[K\rwaiting: 2/2\x1b[K\r\x1b[Kdone\r\n") == ["done"]
    assert screen("abc\rx\r\n") == ["xbc"]


def test_progress_redraws_at_most_four_times_a_second_and_erases_the_line():
    clock, stream = [0.0], io.StringIO()
    progress = queuectl.Progress(True, stream, clock=lambda: clock[0])
    for at, text in ((0.0, "one"), (0.1, "two"), (0.24, "three"), (0.26, "four"), (0.4, "five")):
        clock[0] = at
        progress.show(text)
    assert stream.getvalue() == "\rone\x1b[K\rfour\x1b[K"
    assert progress.drawn
    with progress:
        progress.show("x" * 500)  # truncated to the width (80 when it cannot be read), so it never wraps
    assert stream.getvalue().endswith("\r\x1b[K")
    assert screen(stream.getvalue()) == []
    assert max(len(part) for part in stream.getvalue().split("\r")) <= 80 + 3


def test_progress_off_writes_nothing():
    stream = io.StringIO()
    with queuectl.Progress(False, stream) as progress:
        progress.show("waiting: 0/1 finished, 0 dead")
    assert (stream.getvalue(), progress.drawn) == ("", False)


def test_progress_rate_over_the_last_seconds_and_the_estimate():
    clock = [100.0]
    progress = queuectl.Progress(True, io.StringIO(), clock=lambda: clock[0])
    assert progress.rate(0) is None
    clock[0] = 100.5
    assert progress.rate(5) is None  # less than a second of counts: not known yet
    clock[0] = 101.0
    assert progress.rate(10) == pytest.approx(10.0)
    for second in range(2, 31):  # 10 a second for 10 s, then 1 a second: the window forgets the fast start
        clock[0] = 100.0 + second
        count = 10 * min(second, 10) + max(0, second - 10)
        rate = progress.rate(count)
    assert rate == pytest.approx(1.0)
    assert progress.rate(count - 50) == 0.0  # a count that went down (a job revived) is no negative rate


def test_waiting_line_shows_counts_then_rate_then_estimate():
    line = queuectl.waiting_line
    assert line(0, 5, 0, None) == "waiting: 0/5 finished, 0 dead"
    assert line(312, 1000, 2, 41.0) == "waiting: 312/1000 finished, 2 dead · 41/s · about 17s left"
    assert line(3, 5, 0, 0.0) == "waiting: 3/5 finished, 0 dead · 0.0/s"  # stalled: no estimate
    assert line(1, 1000, 0, 4.0).endswith(" · 4.0/s · about 4m 10s left")
    assert line(0, 100_000, 0, 12.5).endswith(" · 12/s · about 2h 13m left")


@pytest.mark.parametrize("env, flag, tty, on", [
    ({}, False, True, True), ({}, False, False, False), ({}, True, True, False),
    ({"QUEUECTL_NO_PROGRESS": "1"}, False, True, False), ({"QUEUECTL_NO_PROGRESS": "0"}, False, True, True),
    ({"TERM": "dumb"}, False, True, False)])
def test_progress_is_on_only_on_a_terminal_that_wants_it(monkeypatch, env, flag, tty, on):
    class Stderr(io.StringIO):
        def isatty(self):
            return tty
    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.delenv("QUEUECTL_NO_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import argparse
    assert queuectl.Progress.for_command(argparse.Namespace(no_progress=flag)).on is on


def test_wait_draws_a_live_line_on_a_terminal_and_leaves_only_the_result(db, terminal):
    enqueue(db, id="p", command="true")
    for args, result in ((["p"], "queuectl: error: timed out waiting for p"),
                         (["--all"], "queuectl: error: timed out: 1 job still pending, failed or processing")):
        code, out, raw = terminal(db, "wait", *args, "--timeout", "1").finish()
        assert (code, out) == (1, "")
        assert "\rwaiting: 0/1 finished, 0 dead" in raw and "\x1b[K" in raw
        assert screen(raw) == [result]
    run = terminal(db, "wait", "--all")
    run.wait_raw("waiting: 0/1 finished, 0 dead")
    assert finish_due(db) == ["p"]
    code, out, raw = run.finish()
    assert (code, out, screen(raw)) == (0, "", [])  # success: the line is gone, nothing else was written


@sqlite_only
@pytest.mark.parametrize("args, env", [(["--no-progress"], {}), ([], {"QUEUECTL_NO_PROGRESS": "1"}),
                                       ([], {"TERM": "dumb"})])
def test_progress_switched_off_on_a_terminal_writes_only_the_result(db, terminal, args, env):
    enqueue(db, id="p", command="true")
    code, out, raw = terminal(db, "wait", "p", "--timeout", "0.5", *args, **env).finish()
    assert (code, out, raw) == (1, "", "queuectl: error: timed out waiting for p\r\n")


def test_wait_interrupted_on_a_terminal_erases_its_line(db, terminal):
    enqueue(db, id="p", command="true")
    run = terminal(db, "wait", "p")
    run.wait_raw("waiting: ")
    run.popen.send_signal(signal.SIGINT)
    code, out, raw = run.finish()
    assert (code, out, screen(raw)) == (130, "", [])


def test_wait_off_a_terminal_writes_nothing_extra(db):
    enqueue(db, id="p", command="true")
    for args, error in ((["p"], "timed out waiting for p"),
                        (["--all"], "timed out: 1 job still pending, failed or processing")):
        result = script(db, "wait", *args, "--timeout", "0.5")
        assert (result.returncode, result.stdout, result.stderr) == (1, "", f"{ERROR_PREFIX}{error}\n")

# -- run ------------------------------------------------------------------------------------------

def _option_names(db, command):
    code, out, err = cli(db, command, "--help")
    assert code == 0, err
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", out))


@sqlite_only
def test_run_takes_every_option_of_add_but_json_and_adds_burst(db):
    assert _option_names(db, "run") == _option_names(db, "add") - {"--json"} | {"--burst"}
    assert "124" in ok(db, "help", "run") and "125" in ok(db, "help", "run")  # the exit codes


@sqlite_only
@pytest.mark.parametrize("args, fragment", [
    ([], "run: give the command after --"),
    (["--timeout", "soon", "--", "true"], "timeout"),
    (["--env", "NOEQUALS", "--", "true"], "--env wants NAME=VALUE"),
    (["--priority", "x", "--", "true"], "--priority"),
    (["--json", "--", "true"], "unrecognized arguments: --json"),
])
def test_run_bad_input_exits_2_before_anything_is_enqueued(db, args, fragment):
    code, out, err = cli(db, "run", *args)
    assert (code, out) == (2, "")
    assert fragment in err and ERROR_PREFIX in err and "Traceback" not in err
    assert not os.path.exists(db)  # not even a database was made
    code, out, err = cli(db, "--json", "run", "--", "true")
    assert (code, out) == (2, "")
    assert_one_error(err, "run has no --json")


def test_run_on_a_database_this_user_cannot_write_fails_and_changes_nothing(read_only_db):
    folder, db, empty = read_only_db
    before = folder_state(folder)
    result = run_as_reader(db, "run", "--burst", "--", "true")
    assert (result.returncode, result.stdout) == (1, "")
    assert_one_error(result.stderr, db)
    assert folder_state(folder) == before


def test_run_refuses_an_existing_id_or_a_dead_dependency_and_touches_no_job(db):
    enqueue(db, id="a", command="true")
    ok(db, "cancel", "a")
    for args, fragment in ((["--id", "a"], "job 'a' already exists"), (["--depends-on", "a"], "which is dead")):
        code, out, err = cli(db, "run", *args, "--", "true")
        assert (code, out) == (1, "")
        assert_one_error(err, fragment)
    assert [job["id"] for job in json.loads(ok(db, "list", "--json"))] == ["a"]


@pytest.mark.parametrize("state, outcome, exit_code, error, expected", [
    ("completed", "completed", 0, None, 0),
    ("dead", "dead", 3, "exit code 3", 3),
    ("dead", "dead", 137, "killed by signal SIGKILL", 137),
    ("dead", "dead", None, "timed out after 1s (terminated)", 124),
    ("dead", "dead", None, "cannot start: no such file", 125),
    ("dead", "canceled", None, "canceled (terminated)", 125),
    ("dead", "dead", 1, "canceled", 125),  # failed while its cancel was under way: the cancel wins
    ("dead", "lost", None, "worker lost", 125),
    ("dead", None, None, "dependency 'a' is dead", 125),  # never ran
])
def test_run_exit_code_is_the_jobs_own_or_says_why_it_has_none(state, outcome, exit_code, error, expected):
    job = make_job(state=state, exit_code=exit_code, last_error=error)
    last = None if outcome is None else {"outcome": outcome, "exit_code": exit_code, "error": error}
    assert queuectl.run_exit_code(job, last) == expected


def test_run_end_says_how_a_run_ended(store):
    register(store)
    store.enqueue([spec("j", max_retries=2)], T0)
    assert store.run_end("j", 1) is None  # no run yet
    store.claim("w1", T0)
    assert store.run_end("j", 1) == {"outcome": None, "exit_code": None, "error": None}  # running
    store.finish(store.get("j"), "w1", outcome(3, "exit code 3"), SETTINGS, T0 + 1)
    assert store.run_end("j", 1) == {"outcome": "failed", "exit_code": 3, "error": "exit code 3"}


def test_run_streams_the_output_while_the_job_runs_and_exits_with_its_code(db, workers, tmp_path):
    run = workers.spawn("run", "--id", "r", "--max-retries", "1", "--cwd", str(tmp_path), "--",
                        f"echo first; {BLOCKING_JOB.split('; ', 2)[2]}; exit 3")
    reader = LineReader(run.stdout)
    workers.start()
    wait_for(lambda: reader.lines == ["first\n"], "the first line, streamed")
    assert run.poll() is None and state_of(db, "r") == "processing"  # the job waits for `release`
    (tmp_path / "release").touch()
    assert run.wait(timeout=WAIT_S) == 3
    reader.thread.join(WAIT_S)
    assert reader.text() == "first\nfinished\n"
    assert run.stderr.read() == b""


def test_run_announces_a_retry_on_stderr_and_exits_0_once_a_retry_succeeds(db, workers):
    ok(db, "config", "set", "backoff-base", "1")
    workers.start()
    result = script(db, "run", "--id", "r", "--max-retries", "2", "--", 'echo "run $QUEUECTL_ATTEMPT"; '
                    '[ "$QUEUECTL_ATTEMPT" = 2 ]')
    assert (result.returncode, result.stdout) == (0, "run 1\nrun 2\n")
    # When the line is written the second run may have started: then it has no due time.
    assert re.fullmatch(r"queuectl: run 1 of job r failed: exit code 1; it runs again \(attempt 2 of 2(, due "
                        r"(in 1s|now))?\)\n", result.stderr), result.stderr


def test_run_shows_every_run_of_a_job_that_retries_faster_than_it_looks(db, workers):
    ok(db, "config", "set", "backoff-max", "0")  # each retry at once: three runs may end between two looks
    workers.start().wait_log("worker started")
    result = script(db, "run", "--id", "r", "--max-retries", "3", "--", 'echo "run $QUEUECTL_ATTEMPT"; exit 3')
    assert (result.returncode, result.stdout) == (3, "run 1\nrun 2\nrun 3\n")
    assert re.fullmatch(r"queuectl: run 1 of job r failed: exit code 3; it runs again \(attempt 2 of 3(, due now)?\)\n"
                        r"queuectl: run 2 of job r failed: exit code 3; it runs again \(attempt 3 of 3(, due now)?\)\n",
                        result.stderr), result.stderr


def test_run_of_a_job_its_timeout_kills_exits_124(db, workers):
    workers.start()
    result = script(db, "run", "--max-retries", "1", "--timeout", "0.2", "--", "sleep", "30")
    assert (result.returncode, result.stdout, result.stderr) == (124, "", "")


def test_run_keeps_waiting_when_the_worker_is_killed_and_reports_the_rerun(db, workers, tmp_path):
    command = "if [ -e started ]; then echo second; exit 4; fi; touch started; echo first; sleep 60"
    first = workers.start()
    run = workers.spawn("run", "--id", "r", "--max-retries", "1", "--cwd", str(tmp_path), "--", command)
    out, err = LineReader(run.stdout), LineReader(run.stderr)
    wait_for(lambda: out.lines == ["first\n"], "the first run's output")
    first.signal(signal.SIGKILL)
    first.wait()
    assert run.poll() is None  # still waiting for its job
    workers.start()  # recovers the lost run and runs it again
    assert run.wait(timeout=WAIT_S) == 4
    out.thread.join(WAIT_S)
    err.thread.join(WAIT_S)
    assert out.text() == "first\nsecond\n"
    assert err.text().startswith("queuectl: run 1 of job r lost"), err.text()
    assert get_job(db, "r")["state"] == "dead"


def test_run_with_no_live_worker_says_so_once_and_keeps_waiting(db, workers):
    run = workers.spawn("run", "--id", "r", "--", "echo", "done")
    err = LineReader(run.stderr)
    wait_for(lambda: err.lines, "the note")  # after a few seconds
    assert err.lines == ["queuectl: note: no live worker serves queue 'default': start one with queuectl worker "
                         "start\n"]
    assert run.poll() is None
    workers.start()
    assert run.wait(timeout=WAIT_S) == 0
    assert run.stdout.read() == b"done\n"
    err.thread.join(WAIT_S)
    assert len(err.lines) == 1


def test_run_interrupted_without_a_terminal_cancels_its_job_and_exits_130(db, workers, tmp_path):
    run = workers.spawn("run", "--id", "r", "--", "true")
    wait_for(lambda: cli(db, "show", "r")[0] == 0, "the job enqueued")
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=WAIT_S) == 130
    assert run.stderr.read() == b"queuectl: job r canceled\n"
    job = get_job(db, "r")
    assert (job["state"], job["last_error"]) == ("dead", "canceled")


def test_run_interrupted_while_its_job_runs_cancels_and_kills_it(db, workers, tmp_path):
    run = workers.spawn("run", "--id", "r", "--cwd", str(tmp_path), "--", BLOCKING_JOB)
    workers.start()
    _wait_started(tmp_path)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=WAIT_S) == 130
    wait_for(lambda: state_of(db, "r") == "dead", "the canceled job killed")
    assert get_job(db, "r")["last_error"].startswith("canceled")


@pytest.mark.parametrize("answer, state", [("y\n", "dead"), ("\n", "pending"), ("n\n", "pending"), (None, "pending")])
def test_run_interrupted_on_a_terminal_asks_whether_to_cancel(db, terminal, answer, state):
    run = terminal(db, "run", "--id", "r", "--", "true", stdin_path=None)
    wait_for(lambda: cli(db, "show", "r")[0] == 0, "the job enqueued")
    run.popen.send_signal(signal.SIGINT)
    run.wait_raw("queuectl: cancel job r? [y/N] ")
    if answer is None:  # a second Ctrl-C leaves it queued
        run.popen.send_signal(signal.SIGINT)
    else:
        run.type(answer)
    code, out, raw = run.finish()
    assert (code, out) == (130, "")
    assert get_job(db, "r")["state"] == state
    assert screen(raw)[-1] == ("queuectl: job r canceled" if state == "dead" else
                               "queuectl: job r left queued: queuectl logs -f r follows it")


def test_run_whose_terminal_closes_during_its_question_cancels_the_job_and_exits_129(db, terminal):
    run = terminal(db, "run", "--id", "r", "--", "true", stdin_path=None)
    wait_for(lambda: cli(db, "show", "r")[0] == 0, "the job enqueued")
    run.popen.send_signal(signal.SIGINT)
    run.wait_raw("queuectl: cancel job r? [y/N] ")
    run.popen.send_signal(signal.SIGHUP)
    code, out, raw = run.finish()
    assert (code, out) == (129, "")
    assert get_job(db, "r")["state"] == "dead"
    assert screen(raw)[-1] == "queuectl: job r canceled"


def test_run_burst_with_no_worker_runs_its_job_here_and_only_that_one(db):
    enqueue(db, id="other", command="true", priority=-1)  # in the same queue, after ours
    result = script(db, "run", "--burst", "--id", "r", "--max-retries", "1", "--", "sh", "-c", "echo here; exit 5")
    assert (result.returncode, result.stdout) == (5, "here\n")
    assert result.stderr.startswith("queuectl: note: no live worker serves queue 'default': running job r here "
                                    "(--burst)\n")
    assert state_of(db, "other") == "pending"
    assert json.loads(ok(db, "worker", "list", "--json")) == []  # the worker here left with it


def test_run_burst_interrupted_cancels_and_kills_the_job_it_runs_before_it_exits(db, workers, tmp_path):
    run = workers.spawn("run", "--burst", "--id", "r", "--cwd", str(tmp_path), "--", BLOCKING_JOB)
    _wait_started(tmp_path)
    job_pid = int(wait_for(lambda: (tmp_path / "sh.pid").read_text().strip(), "the job's pid"))
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=WAIT_S) == 130
    assert pid_gone(job_pid)  # killed before run exited, not left behind
    job = get_job(db, "r")
    assert (job["state"], job["last_error"].startswith("canceled")) == ("dead", True)
    assert json.loads(ok(db, "worker", "list", "--json")) == []


def test_run_burst_left_queued_on_a_terminal_puts_back_the_job_it_ran(db, terminal, tmp_path):
    run = terminal(db, "run", "--burst", "--id", "r", "--cwd", str(tmp_path), "--", BLOCKING_JOB, stdin_path=None)
    _wait_started(tmp_path)
    job_pid = int(wait_for(lambda: (tmp_path / "sh.pid").read_text().strip(), "the job's pid"))
    run.popen.send_signal(signal.SIGINT)
    run.wait_raw("[y/N] ")
    run.type("n\n")
    code, out, raw = run.finish()
    assert code == 130
    assert pid_gone(job_pid)
    assert get_job(db, "r")["state"] == "pending"  # for a worker to run, as if its worker had stopped


@pytest.mark.parametrize("sig, burst", [(signal.SIGTERM, False), (signal.SIGHUP, True)])
def test_run_ended_by_sigterm_or_sighup_cancels_its_job_and_exits_128_plus_n(db, workers, tmp_path, sig, burst):
    run = workers.spawn("run", *(["--burst"] if burst else []), "--id", "r", "--cwd", str(tmp_path), "--",
                        BLOCKING_JOB)
    if not burst:
        workers.start()
    _wait_started(tmp_path)
    job_pid = int(wait_for(lambda: (tmp_path / "sh.pid").read_text().strip(), "the job's pid"))
    run.send_signal(sig)
    assert run.wait(timeout=WAIT_S) == 128 + sig
    assert b"queuectl: job r canceled\n" in run.stderr.read()
    wait_for(lambda: pid_gone(job_pid) and state_of(db, "r") == "dead", "the canceled job killed")
    assert get_job(db, "r")["last_error"].startswith("canceled")


@pytest.mark.parametrize("burst", [False, True])
def test_run_whose_reader_left_exits_1_and_leaves_its_job_to_the_queue(db, workers, tmp_path, burst):
    command = ("echo first; while [ ! -e release ]; do sleep 0.05; done; echo second; "
               "while [ ! -e release2 ]; do sleep 0.05; done")
    run = workers.spawn("run", *(["--burst"] if burst else []), "--id", "r", "--cwd", str(tmp_path), "--", command)
    if not burst:
        workers.start()
    assert run.stdout.readline() == b"first\n"
    run.stdout.close()  # `queuectl run ... | head -1`
    (tmp_path / "release").touch()
    assert run.wait(timeout=WAIT_S) == 1
    err = run.stderr.read().decode()
    assert "Traceback" not in err and err.endswith("queuectl: error: cannot write to standard output: broken pipe; "
                                                   "job r left queued: queuectl logs -f r follows it\n"), err
    # Not canceled: run here (--burst), it is put back for a worker, as when its worker stops.
    assert state_of(db, "r") == ("pending" if burst else "processing")


def test_run_interrupted_as_its_enqueue_commits_cancels_its_job_not_one_of_that_id(db, monkeypatch):
    enqueue(db, id="a", command="true")  # someone else's
    real_enqueue = queuectl.Store.enqueue

    def interrupted_enqueue(self, specs, now):
        if specs[0]["id"] == "b":  # committed, then interrupted before it returned
            real_enqueue(self, specs, now)
        raise KeyboardInterrupt
    monkeypatch.setattr(queuectl.Store, "enqueue", interrupted_enqueue)
    assert cli(db, "run", "--id", "a", "--", "sleep", "1") == (130, "", "")
    assert state_of(db, "a") == "pending"
    assert cli(db, "run", "--id", "b", "--", "sleep", "1") == (130, "", "queuectl: job b canceled\n")
    assert state_of(db, "b") == "dead"


def test_run_burst_behind_a_job_it_does_not_run_says_so_and_waits(db, workers):
    enqueue(db, id="ahead", command="true", priority=1)
    run = workers.spawn("run", "--burst", "--id", "r", "--", "true")
    err = LineReader(run.stderr)
    wait_for(lambda: len(err.lines) == 2, "the note on the job ahead")
    assert err.lines[1] == ("queuectl: note: job r is due but not run: jobs ahead of it in queue 'default' wait for a "
                            "worker (--burst runs this job only): start one with queuectl worker start\n")
    assert run.poll() is None and state_of(db, "r") == "pending"
    workers.start()  # runs both, in turn
    assert run.wait(timeout=WAIT_S) == 0


@sqlite_only
def test_run_burst_whose_worker_here_stopped_says_so_and_exits_1(db, monkeypatch):
    monkeypatch.setattr(queuectl.Worker, "run", lambda self: 1)  # as one that left its database
    deadline = threading.Timer(WAIT_S, _thread.interrupt_main)  # a Ctrl-C if it waits on (exit 130)
    deadline.start()
    try:
        code, out, err = cli(db, "run", "--burst", "--id", "r", "--", "true")
    finally:
        deadline.cancel()
    assert (code, out) == (1, ""), err
    assert err.endswith("queuectl: error: the worker here (--burst) has stopped; job r left queued: queuectl logs -f r "
                        "follows it\n"), err
    assert state_of(db, "r") == "pending"


def test_run_burst_with_a_live_worker_leaves_the_job_to_it(db, workers):
    workers.start().wait_log("worker started")
    result = script(db, "run", "--burst", "--", "echo", "there")
    assert (result.returncode, result.stdout, result.stderr) == (0, "there\n", "")



def test_enqueue_batch_over_10000_lines_counts_on_a_terminal_then_says_how_it_went(db, terminal, tmp_path):
    code, out, raw = terminal(db, "enqueue", "-", stdin_path=batch_file(tmp_path, 10_001)).finish()
    assert code == 0
    assert out.split() == [f"b{n}" for n in range(10_001)]
    assert re.search(r"\renqueue: read \d+ lines · validated \d+ · stored \d+\x1b\[K", raw), raw[:300]
    [final] = screen(raw)
    assert re.fullmatch(r"queuectl: enqueued 10001 jobs in \d+\.\ds", final), final


def test_enqueue_batch_of_10000_lines_or_off_a_terminal_writes_nothing_extra(db, terminal, tmp_path):
    code, out, raw = terminal(db, "enqueue", "-", stdin_path=batch_file(tmp_path, 10_000)).finish()
    assert (code, raw) == (0, "")
    assert len(out.split()) == 10_000
    ok(db, "delete", *out.split())
    result = script_stdin(db, batch_file(tmp_path, 10_001).read_bytes(), "enqueue", "-")
    assert (result.returncode, result.stderr) == (0, "")
    assert len(result.stdout.split()) == 10_001


# ---- what a person reads: job data cannot drive the terminal -------------------------------------

def a_dead_hostile_job(db, job_id="hostile"):
    """A dead job whose command, last error and run error are TERMINAL_HOSTILE, its output HOSTILE_OUTPUT."""
    with opened(db) as s:
        register(s, now=s.now())
        s.enqueue([spec(job_id, TERMINAL_HOSTILE, max_retries=0)], s.now())
        job = s.claim("w1", s.now())
        s.finish(job, "w1", outcome(3, TERMINAL_HOSTILE, HOSTILE_OUTPUT.encode()), SETTINGS, s.now())


def test_printable_escapes_what_drives_a_terminal_and_keeps_the_rest():
    assert queuectl.printable(TERMINAL_HOSTILE) == TERMINAL_SHOWN
    assert queuectl.printable("\t\x00\x7f\x85\u2029\u202a\u2066\u200f\u061c") == \
        r"\t\x00\x7f\x85\u2029\u202a\u2066\u200f\u061c"
    kept = "ünïcödé ✓ 日本語 🚀 e\u0301 ｆｕｌｌ zero\u200bwidth \u00a0 back\\slash"
    assert queuectl.printable(kept) == kept
    assert queuectl.printable("one\r\n\ttwo\x1b\n", lines=True) == "one\\r\n\ttwo\\x1b\n"


def test_list_and_dlq_list_show_a_hostile_command_escaped_and_json_exact(db):
    a_dead_hostile_job(db)
    for command in (("list",), ("dlq", "list")):
        out = ok(db, *command)
        assert_terminal_safe(out)
        header, row = out.splitlines()
        assert row.startswith("hostile ") and row.endswith(" " + TERMINAL_SHOWN)
        [job] = json.loads(ok(db, *command, "--json"))
        assert (job["command"], job["last_error"]) == (TERMINAL_HOSTILE, TERMINAL_HOSTILE)


def test_show_escapes_every_field_and_the_output_and_json_stays_exact(db):
    a_dead_hostile_job(db)
    out = ok(db, "show", "hostile")
    assert_terminal_safe(out)
    lines = out.split("\n")
    assert f"command:      {TERMINAL_SHOWN}" in lines and f"last_error:   {TERMINAL_SHOWN}" in lines
    assert any(line.startswith("  #1 ") and line.endswith(f"exit=3  {TERMINAL_SHOWN}") for line in lines)
    assert lines[lines.index("output:") + 1:] == ["ok\\x1b[2K\\rstate:        completed", "\tsecond line", ""]
    shown = json.loads(ok(db, "show", "hostile", "--json"))
    assert (shown["command"], shown["last_error"], shown["runs"][0]["error"]) == (TERMINAL_HOSTILE,) * 3
    assert shown["output"] == HOSTILE_OUTPUT
    code, out, _ = cli(db, "logs", "hostile")  # README: `logs` is the job's output itself, like cat
    assert (code, out) == (0, HOSTILE_OUTPUT)


def test_json_output_escapes_c1_separators_and_bidi_controls_and_keeps_the_value(db):
    """json.dumps leaves DEL, C1, U+2028 and bidi controls raw (it escapes C0 only): written as \\u
    escapes they decode to the same string, and `list --json` on a terminal drives nothing."""
    a_dead_hostile_job(db)
    for command in (("list", "--json"), ("show", "hostile", "--json")):
        out = ok(db, *command)
        assert not RAW_CONTROL.search(out), out
        assert "\\u009b" in out and "\\u2028" in out and "\\u202e" in out
    assert json.loads(ok(db, "list", "--json"))[0]["command"] == TERMINAL_HOSTILE


def test_queues_status_and_limit_show_a_stored_queue_name_escaped(db):
    """Queue names are checked at enqueue, but a row written by another tool or version is still shown safely."""
    enqueue(db, id="q", command="true")
    with opened(db) as s:
        s.pause([TERMINAL_HOSTILE])
        s.set_limit(TERMINAL_HOSTILE, 2)
    db_sql(db, "UPDATE jobs SET queue = ? WHERE id = ?", (TERMINAL_HOSTILE, "q"))
    for command in (("list",), ("queues",), ("status",), ("limit",)):
        out = ok(db, *command)
        assert_terminal_safe(out)
        assert TERMINAL_SHOWN[:8] in out, (command, out)
    assert TERMINAL_SHOWN in ok(db, "queues") and TERMINAL_SHOWN in ok(db, "status")
    assert json.loads(ok(db, "list", "--json"))[0]["queue"] == TERMINAL_HOSTILE
    assert [r["queue"] for r in json.loads(ok(db, "queues", "--json"))] == [TERMINAL_HOSTILE]


def test_worker_list_shows_a_hostile_worker_id_host_and_job_id_escaped(db):
    with opened(db) as s:
        identity = {"host": TERMINAL_HOSTILE, "pid": 1, "proc_start": "1", "boot_id": "b", "pid_ns": "ns"}
        s.register(f"w{TERMINAL_HOSTILE}", identity, 1, s.now())
        s.enqueue([spec("job\u202eevil")], s.now())
        s.claim(f"w{TERMINAL_HOSTILE}", s.now())
    out = ok(db, "worker", "list")
    assert_terminal_safe(out)
    header, row = out.splitlines()
    assert row.startswith(f"w{TERMINAL_SHOWN} {TERMINAL_SHOWN} ") and "job\\u202eevil" in row
    [worker] = json.loads(ok(db, "worker", "list", "--json"))
    assert (worker["id"], worker["host"], worker["jobs"]) == (f"w{TERMINAL_HOSTILE}", TERMINAL_HOSTILE, ["job\u202eevil"])


def test_list_keeps_alignment_for_a_wide_id_with_an_escaped_character(db):
    """(Ids with a direction mark are refused at input since; one written behind queuectl's back, through
    the Store, is still shown escaped and aligned.)"""
    import unicodedata

    def columns(text):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    with opened(db) as store:
        for i, job_id in enumerate(("日本\u202eジョブ", "plain", "日本語のジョブ名前\u202eです")):
            store.enqueue([spec(job_id)], store.now() + i)
    header, *rows = ok(db, "list").splitlines()
    assert {columns(line[:line.index(" pending ")]) for line in rows} == {columns(header[:header.index(" STATE ")])}
    assert rows[0].startswith("日本\\u202eジョブ ")


def test_an_error_quoting_stored_text_is_escaped_and_one_line(db):
    """`wait` names a dead job's last error. (It named the ids too, which may no longer hold a bidi
    override: such an id is refused at input, by `wait` as by `enqueue`.)"""
    a_dead_hostile_job(db)
    code, out, err = cli(db, "wait", "hostile")
    assert (code, out) == (1, "")
    assert_one_error(err, TERMINAL_SHOWN)
    assert_terminal_safe(err)
    code, out, err = cli(db, "wait", "late\u202eid", "--timeout", "0")
    assert (code, out) == (2, "")
    assert_one_error(err, "direction marks")
    assert_terminal_safe(err)


def test_the_progress_line_draws_no_control_character_of_its_text():
    stream = io.StringIO()
    queuectl.Progress(True, stream=stream, clock=lambda: 0.0).show(f"job {TERMINAL_HOSTILE}")
    assert stream.getvalue() == f"\rjob {TERMINAL_SHOWN}"[:79] + "\x1b[K"


def test_log_lines_escape_job_data_in_text_and_keep_it_exact_in_json(store, caplog):
    import logging
    register(store)
    store.enqueue([spec("job\u202eevil", TERMINAL_HOSTILE, max_retries=0)], T0)
    runner = queuectl.Runner(store, "w1", lambda job, registration: None)
    runner.execute = lambda job, env, abort, on_output: outcome(3, TERMINAL_HOSTILE)
    with caplog.at_level("INFO", logger="queuectl"):
        assert runner.run_once(now=T0)
    text_lines = queuectl.TextLines(logging.Formatter())
    for record in caplog.records:
        line = text_lines.format(record)
        assert_terminal_safe(line)
        assert "\n" not in line and "job\\u202eevil" in line
        as_json = queuectl.JsonLines().format(record)
        assert not RAW_CONTROL.search(as_json) and json.loads(as_json)["job_id"] == "job\u202eevil"
    dead = json.loads(queuectl.JsonLines().format(caplog.records[-1]))
    assert (dead["event"], dead["error"]) == ("job_dead", TERMINAL_HOSTILE)
    assert text_lines.format(caplog.records[-1]).endswith(f"dead after 1 attempt: {TERMINAL_SHOWN}")


def test_a_worker_text_log_shows_a_hostile_command_and_id_escaped(db, workers, tmp_path):
    with opened(db) as store:  # the id behind queuectl's back: refused at input since
        store.enqueue([spec("job\u202eevil", "exit 3 # \x1b[2J\x9b\u2028\u202e", max_retries=0, cwd=str(tmp_path))],
                      store.now())
    worker = workers.start("--burst")
    assert worker.wait() == 0, worker.log()
    log_text = worker.log()
    assert_terminal_safe(log_text)
    # the claimed line's command has its whitespace (U+2028 among it) run together, then is escaped
    assert "job job\\u202eevil claimed (attempt 1): exit 3 # \\x1b[2J\\x9b \\u202e\n" in log_text


def test_an_id_with_a_direction_mark_is_refused_so_ids_print_as_they_are(db):
    """A bidi control (U+202E) in an id was accepted and echoed raw by enqueue, reordering the line on a
    terminal; escaped, it would no longer be the id a script reads back. Ids may not contain one."""
    before = snapshot(db)
    for bad in ("a\u202eb", "a\u2066b", "a\u200fb", "a\u061cb"):
        code, out, err = cli(db, "enqueue", json.dumps({"id": bad, "command": "true"}))
        assert (code, out) == (2, "")
        assert_one_error(err, "direction marks")
    assert snapshot(db) == before


def test_ids_and_config_values_written_behind_queuectls_back_print_escaped(sqlite_db):
    """print_ids and `config get`/`list` trusted what they printed; a value written into the database
    directly (not through queuectl) reached the terminal raw."""
    enqueue(sqlite_db, id="seed", command="true")
    conn = sqlite3.connect(sqlite_db)
    with conn:
        conn.execute("UPDATE jobs SET id = ?, state = 'dead' WHERE id = 'seed'", ("evil\x1b]0;owned\x07",))
        conn.execute("INSERT OR REPLACE INTO config (key, value) VALUES ('max_retries', ?)", (json.dumps("\x1b[2J"),))
    conn.close()
    out = ok(sqlite_db, "dlq", "retry", "--all")
    assert out == "evil\\x1b]0;owned\\x07\n"
    assert ok(sqlite_db, "config", "get", "max-retries") == "\\x1b[2J\n"
    assert "max-retries = \\x1b[2J\n" in ok(sqlite_db, "config", "list")


# ---- closed and full standard streams, exit_now --------------------------------------------------

def full_output(*args):
    """`python3 queuectl.py ARGS` with its stdout on /dev/full (a disk with no room): (exit code, stderr)."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, QUEUECTL, *args], stdin=subprocess.DEVNULL, stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=WAIT_S, env=child_env())
    return result.returncode, result.stderr


def test_a_command_run_as_a_script_flushes_its_output_and_keeps_its_exit_code(db):
    """The script skips the interpreter's teardown (exit_now): the output must still arrive whole
    through a pipe, and the exit code be the command's."""
    def script(*args, stdin=None):
        return subprocess.run([sys.executable, QUEUECTL, "--db", db, *args], input=stdin, capture_output=True,
                              text=True, timeout=60)
    batch = jsonl(*({"id": f"job-{n:04}", "command": "true"} for n in range(300)))
    done = script("enqueue", "-", stdin=batch)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"job-{n:04}" for n in range(300)]
    listed = script("list", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 300
    again = script("enqueue", json.dumps({"id": "job-0007", "command": "true"}))
    assert (again.returncode, again.stdout) == (1, "")
    assert_one_error(again.stderr, "'job-0007'", "already exists")


@pytest.mark.parametrize("error, skips", [(BrokenPipeError(32, "Broken pipe"), True),
                                          (OSError(28, "No space left on device"), False)])
def test_exit_now_skips_the_teardown_only_when_the_output_was_written_or_nobody_reads_it(monkeypatch, error, skips):
    """A reader that left changes nothing; output that could not be written (a full disk) takes the
    usual exit, whose last flush reports it, never a silent os._exit."""
    class Unwritable(io.StringIO):
        def flush(self):
            raise error
    ended = []
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # as in a command's process
    monkeypatch.setattr(sys, "stdout", Unwritable())
    monkeypatch.setattr(os, "_exit", lambda code: ended.append(("_exit", code)))
    monkeypatch.setattr(sys, "exit", lambda code: ended.append(("exit", code)))
    queuectl.exit_now(3)
    assert ended[0] == (("_exit", 3) if skips else ("exit", 3))


def test_a_command_run_with_its_error_output_closed_exits_zero(sqlite_db):
    """exit_now flushes stdout and stderr before os._exit; a stream Python could not open (its
    descriptor closed, as `2>&-` or a daemon leaves it) is None, and must not turn success into exit 1."""
    enqueue(sqlite_db, id="a", command="true")
    probe = ("import os, subprocess, sys; os.close(2); "
             "sys.exit(subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, close_fds=False).returncode)")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, QUEUECTL, "--db", sqlite_db, "status"],
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT_S, env=child_env())
    assert result.returncode == 0


def test_add_with_its_output_closed_stores_the_job_and_exits_zero_without_a_traceback(sqlite_db):
    """`add … >&-`: Python starts with sys.stdout None, and printing the new id raised AttributeError
    after the job was stored (a traceback, exit 1). What is written there now goes to /dev/null."""
    probe = ("import os, subprocess, sys; os.close(1); "
             "sys.exit(subprocess.run(sys.argv[1:], close_fds=False).returncode)")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, QUEUECTL, "--db", sqlite_db, "add",
                             "--id", "quiet", "--", "true"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            timeout=WAIT_S, env=child_env())
    assert (result.returncode, result.stderr) == (0, b"")
    assert state_of(sqlite_db, "quiet") == "pending"


def test_enqueue_from_a_closed_stdin_reads_nothing_and_exits_zero_without_a_traceback(sqlite_db):
    """`enqueue - <&-`: Python starts with sys.stdin None, and reading the batch raised AttributeError.
    A closed stdin now reads as /dev/null: an empty batch, as `< /dev/null` gives."""
    probe = ("import os, subprocess, sys; os.close(0); "
             "sys.exit(subprocess.run(sys.argv[1:], close_fds=False).returncode)")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, QUEUECTL, "--db", sqlite_db, "enqueue",
                             "-"], capture_output=True, timeout=WAIT_S, env=child_env())
    assert (result.returncode, result.stderr) == (0, b"queuectl: note: no jobs read\n")
    assert json.loads(ok(sqlite_db, "list", "--json")) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_an_id_that_cannot_be_printed_says_the_job_was_stored(db):
    """An enqueue whose stdout is a full disk said only "No space left on device" (exit 1) though the job
    was stored, so a script retrying it made a duplicate. It now names stdout and says what was saved."""
    code, err = full_output("--db", db, "enqueue", '{"id": "kept", "command": "true"}')
    assert code == 1
    assert_one_error(err, "cannot write to standard output", "no space left on device", "changes were saved")
    assert state_of(db, "kept") == "pending"
    code, err = full_output("--db", db, "list")  # a command that changed nothing says nothing was saved
    assert code == 1
    assert_one_error(err, "cannot write to standard output")
    assert "saved" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_that_cannot_be_printed_is_an_error_not_a_silent_success(flag):
    code, err = full_output(flag)
    assert code == 1
    assert_one_error(err, "cannot write to standard output")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_logs_to_a_full_disk_names_standard_output(sqlite_db):
    """`logs` writes a job's output as bytes, past the text layer that OutputLost guarded: a full disk
    still said only "No space left on device"."""
    enqueue(sqlite_db, id="o", command="echo hello")
    ok(sqlite_db, "worker", "start", "--burst")
    code, err = full_output("--db", sqlite_db, "logs", "o")
    assert code == 1
    assert_one_error(err, "cannot write to standard output")


def test_a_process_left_with_daemon_threads_only_skips_the_interpreters_teardown():
    """A stopped PostgreSQL worker leaves daemon threads (its listener in libpq's wait, the signal
    watcher): a teardown that raced them could crash a worker with SIGSEGV in libpython after it had
    logged "worker exited (0)" (DECISIONS.md). exit_now skips the teardown (os._exit) unless a thread
    Python would wait for is left; atexit handlers, part of the teardown, then never run."""
    probe = ("import atexit, sys, threading, time; sys.path.insert(0, sys.argv[1]); import queuectl; "
             "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
             "atexit.register(print, 'teardown', flush=True); print('out', end=''); queuectl.exit_now(3)")
    result = subprocess.run([sys.executable, "-c", probe, HERE], capture_output=True, text=True, timeout=WAIT_S,
                            env=child_env())
    assert (result.returncode, result.stdout, result.stderr) == (3, "out", "")
    waits = probe.replace("daemon=True", "daemon=False").replace("args=(60,)", "args=(0.2,)")
    result = subprocess.run([sys.executable, "-c", waits, HERE], capture_output=True, text=True, timeout=WAIT_S,
                            env=child_env())
    assert (result.returncode, result.stdout) == (3, "outteardown\n")  # a thread it must wait for: the usual exit


# ---- the launcher: the command as users install it (a copied file run directly) ------------------
# Run as a program, the file's `#!/bin/sh` header execs python3 on a loader that runs it from
# bytecode cached in $XDG_CACHE_HOME/queuectl.

def _installed(tmp_path, name="queuectl", source=None):
    """A copy of queuectl.py (or of `source` text) as an executable `bin/NAME` under tmp_path."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(source if source is not None else open(QUEUECTL).read())
    path.chmod(0o755)
    return path


def _launcher_env(tmp_path, **extra):
    """Bytecode writing on (as users have it), the cache in tmp_path, and `python3` this interpreter."""
    env = child_env(XDG_CACHE_HOME=str(tmp_path / "cache"),
                    PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra)
    return env


def _run_installed(program, env, *args, cwd=None):
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=WAIT_S, env=env,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def _cached(tmp_path):
    folder = tmp_path / "cache" / "queuectl"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _entry_name(program):
    """The name of a program's cache entry: a hash of its real path, the interpreter's tag, -O level."""
    from importlib.util import source_hash
    digest = source_hash(os.fsencode(os.path.realpath(program))).hex()
    return f"queuectl-{digest}.{sys.implementation.cache_tag}-O{sys.flags.optimize}.pyc"


def _from_the_cache(program):
    """A cache entry with the right key whose code prints "from the cache" (as an attacker would plant it)."""
    from importlib.util import MAGIC_NUMBER, source_hash
    key = MAGIC_NUMBER + (3).to_bytes(4, "little") + source_hash(program.read_bytes())
    return key + marshal.dumps(compile("print('from the cache')", str(program), "exec"))


def _bare_python3(tmp_path):
    """A folder whose `python3` loads no module it need not at start-up (as Debian's /usr/bin/python3;
    this one's site preloads `types`, which would hide a launcher import from the current folder)."""
    folder = tmp_path / "bare"
    folder.mkdir()
    wrapper = folder / "python3"
    for interpreter in ("/usr/bin/python3", f"{sys.executable} -S"):
        wrapper.write_text(f'#!/bin/sh\nexec {interpreter} "$@"\n')
        wrapper.chmod(0o755)
        probe = "import sys; print(sys.version_info >= (3, 11) and not {'types', 'importlib.util'} & set(sys.modules))"
        r = subprocess.run([str(wrapper), "-c", probe], capture_output=True, text=True, timeout=WAIT_S, cwd=tmp_path)
        if r.stdout == "True\n":
            return folder
    raise AssertionError("no python3 without preloaded modules")


def test_installed_copy_runs_from_cached_bytecode_from_its_second_run(tmp_path):
    program, env = _installed(tmp_path), _launcher_env(tmp_path)
    db = str(tmp_path / "q.db")
    first = _run_installed(program, env, "--db", db, "enqueue", '{"id": "a", "command": "true"}')
    assert (first.returncode, first.stdout, first.stderr) == (0, "a\n", "")
    [pyc] = _cached(tmp_path)
    # Replace the cached code with other code under the same key: a run that prints its output used the cache.
    with open(pyc, "rb") as f:
        key = f.read(16)
    marked = compile("print('from the cache')", str(program), "exec")
    pyc.write_bytes(key + marshal.dumps(marked))
    second = _run_installed(program, env, "--version")
    assert (second.returncode, second.stdout) == (0, "from the cache\n")


def test_installed_copy_never_runs_stale_bytecode(tmp_path):
    """An edit that keeps the file's size and modification time still takes effect: the cache is
    checked against the content, not the file's metadata."""
    program, env = _installed(tmp_path), _launcher_env(tmp_path)
    assert _run_installed(program, env, "--version").stdout.split() == ["queuectl", queuectl.__version__]
    stat_before = program.stat()
    text = program.read_text()
    edited = "9" * len(queuectl.__version__)
    program.write_text(text.replace(f'__version__ = "{queuectl.__version__}"', f'__version__ = "{edited}"', 1))
    os.utime(program, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    assert program.stat().st_size == stat_before.st_size
    assert _run_installed(program, env, "--version").stdout.split() == ["queuectl", edited]
    assert len(_cached(tmp_path)) == 1  # the entry of this path was replaced, not added to


def test_two_copies_at_different_paths_keep_their_own_code(tmp_path):
    one = _installed(tmp_path, "queuectl")
    two = _installed(tmp_path, "queuectl-next", one.read_text().replace(
        f'__version__ = "{queuectl.__version__}"', '__version__ = "2.0.0"', 1))
    env = _launcher_env(tmp_path)
    for _ in range(2):
        assert _run_installed(one, env, "--version").stdout.split() == ["queuectl", queuectl.__version__]
        assert _run_installed(two, env, "--version").stdout.split() == ["queuectl", "2.0.0"]
    assert len(_cached(tmp_path)) == 2


@pytest.mark.parametrize("cache", ["file", "readonly", "relative"])
def test_installed_copy_works_without_a_usable_cache_folder(tmp_path, cache):
    blocker = tmp_path / "cache"
    if cache == "file":
        blocker.write_text("not a folder")  # a folder inside it cannot be made, even by root
    elif cache == "readonly":
        blocker.mkdir()
        (blocker / "queuectl").write_text("")  # where the cache folder should be: a file
    program = _installed(tmp_path)
    env = _launcher_env(tmp_path)
    if cache == "relative":
        env["XDG_CACHE_HOME"] = "relative/cache"  # not absolute: ignored, as the XDG spec says
        env["HOME"] = str(tmp_path / "home")
    db = str(tmp_path / "q.db")
    for i in range(2):
        r = _run_installed(program, env, "--db", db, "enqueue", f'{{"id": "j{i}", "command": "true"}}', cwd=tmp_path)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"j{i}\n", "")
    assert not (tmp_path / "relative").exists()
    if cache == "relative":
        assert len(list((tmp_path / "home" / ".cache" / "queuectl").iterdir())) == 1


@pytest.mark.parametrize("plant", ["foreign-entry", "foreign-folder", "shared-folder", "writable-entry", "symlink",
                                   "fifo", "oversized"])
def test_installed_copy_runs_only_bytecode_that_only_its_user_could_have_cached(tmp_path, plant):
    """An entry someone else could have written (root run with another user's HOME, a folder others may
    write to), a link, a FIFO (which would block the read) or an implausibly large file: compiled instead."""
    program, env = _installed(tmp_path), _launcher_env(tmp_path)
    assert _run_installed(program, env, "--version").returncode == 0
    folder = tmp_path / "cache" / "queuectl"
    pyc = folder / _entry_name(program)
    pyc.unlink()
    if plant.startswith("foreign"):
        if os.geteuid() != 0:
            pytest.skip("only root can give a file to another user")
        import pwd
        pyc.write_bytes(_from_the_cache(program))
        os.chown(pyc if plant == "foreign-entry" else folder, pwd.getpwnam("nobody").pw_uid, -1)
    elif plant == "shared-folder":
        pyc.write_bytes(_from_the_cache(program))
        folder.chmod(0o770)
    elif plant == "writable-entry":
        pyc.write_bytes(_from_the_cache(program))
        pyc.chmod(0o666)
    elif plant == "symlink":
        (tmp_path / "elsewhere.pyc").write_bytes(_from_the_cache(program))
        pyc.symlink_to(tmp_path / "elsewhere.pyc")
    elif plant == "fifo":
        os.mkfifo(pyc)
    else:
        pyc.write_bytes(_from_the_cache(program))  # marshal ignores what follows the code
        os.truncate(pyc, 17 << 20)
    r = _run_installed(program, env, "--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"queuectl {queuectl.__version__}\n", "")


def test_installed_copy_writes_its_cache_entry_without_following_links(tmp_path):
    """The entry is written to a new private file (0600), never through a link planted at the
    temporary name, which would overwrite the link's target."""
    program, env = _installed(tmp_path), _launcher_env(tmp_path)
    (tmp_path / "cache" / "queuectl").mkdir(parents=True, mode=0o700)
    pyc = tmp_path / "cache" / "queuectl" / _entry_name(program)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    # $$ is the pid the launcher gets: sh execs the program, whose sh execs python3.
    plant = 'ln -s "$1" "$2.$$.tmp" && exec "$3" --version'
    r = subprocess.run(["sh", "-c", plant, "sh", str(victim), str(pyc), str(program)], capture_output=True,
                       text=True, timeout=WAIT_S, env=env, stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"queuectl {queuectl.__version__}\n", "")
    assert victim.read_bytes() == b"keep"
    assert _run_installed(program, env, "--version").returncode == 0
    assert [p.name for p in _cached(tmp_path)] == [pyc.name]
    assert stat.S_IMODE(pyc.lstat().st_mode) == 0o600 and stat.S_ISREG(pyc.lstat().st_mode)


def test_installed_copy_caches_nothing_with_an_empty_home(tmp_path):
    """HOME= is no home: no cache (root would otherwise write /.cache/queuectl), the command still works."""
    program, env = _installed(tmp_path), _launcher_env(tmp_path, HOME="")
    del env["XDG_CACHE_HOME"]
    here = tmp_path / "here"
    here.mkdir()
    root_entry = os.path.join("/.cache/queuectl", _entry_name(program))
    for _ in range(2):
        r = _run_installed(program, env, "--version", cwd=here)
        assert (r.returncode, r.stdout) == (0, f"queuectl {queuectl.__version__}\n")
    assert not os.path.lexists(root_entry) and list(here.iterdir()) == []


def test_installed_copy_honours_pythondontwritebytecode(tmp_path):
    program = _installed(tmp_path)
    r = _run_installed(program, _launcher_env(tmp_path, PYTHONDONTWRITEBYTECODE="1"), "--version")
    assert r.returncode == 0 and queuectl.__version__ in r.stdout
    assert _cached(tmp_path) == []


def test_installed_copy_passes_exit_codes_and_errors_through(tmp_path):
    program, env = _installed(tmp_path), _launcher_env(tmp_path)
    bad = _run_installed(program, env, "--db", str(tmp_path / "q.db"), "enqueue", "{not json")
    assert bad.returncode == 2 and bad.stderr.startswith(ERROR_PREFIX) and "Traceback" not in bad.stderr
    assert not (tmp_path / "q.db").exists()  # bad input creates no queue
    missing = _run_installed(program, env, "--db", str(tmp_path / "q.db"), "show", "nope")
    assert missing.returncode == 1 and missing.stderr.splitlines()[-1].startswith(ERROR_PREFIX)


def test_installed_copy_does_not_import_from_the_current_folder(tmp_path):
    """As for a script, the program's own folder is first on sys.path, not the folder it is run from."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "argparse.py").write_text("raise SystemExit('imported from the current folder')\n")
    r = _run_installed(_installed(tmp_path), _launcher_env(tmp_path), "--version", cwd=here)
    assert r.returncode == 0 and queuectl.__version__ in r.stdout, r.stderr


def test_installed_copy_imports_none_of_its_own_modules_from_the_current_folder(tmp_path):
    """Not even the loader's own imports, on a python3 that has not loaded them yet at start-up: a
    types.py or importlib/ where someone runs queuectl (as root, say) must never run."""
    here = tmp_path / "here"
    (here / "importlib").mkdir(parents=True)
    planted = ["types", "marshal", "os", "stat", "sys", "pwd", "json", "argparse", "sqlite3", "importlib/__init__"]
    for name in planted:
        (here / f"{name}.py").write_text(f"open({str(tmp_path / 'planted-ran')!r}, 'a').write({name!r})\n")
    env = _launcher_env(tmp_path, PATH=f"{_bare_python3(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    program, db = _installed(tmp_path), str(tmp_path / "q.db")
    for i in range(2):  # compiled and cached, then from the cache
        r = _run_installed(program, env, "--db", db, "enqueue", f'{{"id": "j{i}", "command": "true"}}', cwd=here)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"j{i}\n", "")
        assert not (tmp_path / "planted-ran").exists(), (tmp_path / "planted-ran").read_text()
    assert len(_cached(tmp_path)) == 1


def test_installed_copy_finds_modules_on_pythonpath(tmp_path):
    """The loader keeps the current folder off sys.path (-P), not PYTHONPATH or the user's site (-I
    would drop both): psycopg installed there must still import."""
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "psycopg.py").write_text("raise SystemExit('psycopg from PYTHONPATH')\n")
    r = _run_installed(_installed(tmp_path), _launcher_env(tmp_path, PYTHONPATH=str(fake)),
                       "--db", "postgresql://nobody@127.0.0.1:9/none", "status")
    assert "psycopg from PYTHONPATH" in r.stderr


def test_script_and_module_runs_are_unchanged(tmp_path):
    env = _launcher_env(tmp_path, PYTHONPATH=HERE)
    for argv in ([sys.executable, QUEUECTL, "--version"], [sys.executable, "-m", "queuectl", "--version"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, env=env, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.split() == ["queuectl", queuectl.__version__], (argv, r.stderr)
    assert _cached(tmp_path) == []  # those runs cache as Python does, not in the launcher's folder
    assert queuectl.__doc__.startswith("queuectl: a persistent background job queue")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_installed_worker_gets_signals_itself(sqlite_db, workers, tmp_path, sig):
    """The launcher execs: the process started is the worker itself (no shell or loader in between),
    so the first signal is a graceful stop and a second one kills the job and exits 130, as without it."""
    enqueue(sqlite_db, id="run", command=BLOCKING_JOB, cwd=str(tmp_path))
    program = _installed(tmp_path)
    log_path = tmp_path / "installed.stderr"
    with open(log_path, "wb") as err:
        popen = subprocess.Popen([str(program), "--db", sqlite_db, "worker", "start"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                 env=_launcher_env(tmp_path, **{TAG_VAR: workers.tag}))
    worker = WorkerProc(popen, log_path)
    workers.procs.append(worker)
    worker.wait_log("worker started")
    assert os.path.realpath(f"/proc/{popen.pid}/exe") == os.path.realpath(sys.executable)
    _wait_started(tmp_path)
    worker.signal(sig)
    worker.wait_log("stopping")
    worker.signal(sig)
    assert worker.wait() == 130, worker.log()
    assert get_job(sqlite_db, "run")["state"] == "pending"


def test_an_installed_worker_shows_its_own_command_line_in_ps(sqlite_db, workers, tmp_path):
    """ps, top and systemd show /proc/PID/cmdline: the launcher's few bytes, then the file's path and its
    arguments (not the loader's text, which a -c of it put in front of them)."""
    program = _installed(tmp_path)
    log_path = tmp_path / "installed.stderr"
    with open(log_path, "wb") as err:
        popen = subprocess.Popen([str(program), "--db", sqlite_db, "worker", "start"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                 env=_launcher_env(tmp_path, **{TAG_VAR: workers.tag}))
    worker = WorkerProc(popen, log_path)
    workers.procs.append(worker)
    worker.wait_log("worker started")
    with open(f"/proc/{popen.pid}/cmdline", "rb") as f:
        args = f.read().rstrip(b"\0").split(b"\0")
    at = args.index(os.fsencode(program))
    assert args[at:] == [os.fsencode(program), b"--db", os.fsencode(sqlite_db), b"worker", b"start"]
    before = b" ".join(args[:at])
    assert len(before) < 120 and b"\n" not in before and args[1:3] == [b"-P", b"-c"], before
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


# ---- shell completion: `completion SHELL` and the hidden `__complete` --------------------------------

def complete(*words, env=None):
    """`queuectl __complete zsh WORDS...` in-process (the last word is the one under the cursor): its values
    and exit code, with nothing on stderr."""
    code, out, err = run_main(["__complete", "zsh", *words])
    assert err == "", err
    return code, out.splitlines()


@pytest.fixture
def completing_db(db):
    """A queue with the values completion offers: ids with ':' and '@', a dead job, queues waiting, paused
    and limited, a schedule."""
    for job_id, queue in (("tick@2026-12-02T02:00:00Z", "default"), ("tick@2026-12-02T03:00:00Z", "default"),
                          ("build-1", "builds"), ("build-2", "builds"), ("old-1", "old")):
        ok(db, "add", "--id", job_id, "--queue", queue, "--", "true")
    ok(db, "cancel", "old-1")  # a waiting job canceled goes to the DLQ
    ok(db, "pause", "--queue", "held")
    ok(db, "limit", "capped", "2")
    ok(db, "schedule", "add", '{"id": "nightly", "cron": "0 2 * * *", "tz": "UTC", "command": "true"}')
    return db


COMPLETED_VALUES = [  # (the words after `queuectl --db DB`, the last one under the cursor), the values
    (["show", "bu"], ["build-1", "build-2"]),
    (["logs", "tick@2026-12-02T02:"], ["tick@2026-12-02T02:00:00Z"]),
    (["wait", "tick@"], ["tick@2026-12-02T02:00:00Z", "tick@2026-12-02T03:00:00Z"]),
    (["dlq", "retry", ""], ["old-1"]),
    (["add", "--depends-on", "build-"], ["build-1", "build-2"]),
    (["list", "--queue", ""], ["builds", "capped", "default", "held", "old"]),
    (["limit", "b"], ["builds"]),
    (["schedule", "pause", "n"], ["nightly"]),
    (["schedule", "next", ""], ["nightly"]),
    (["config", "get", "ret"], ["retention"]),
    (["list", "--state", "d"], ["dead"]),
    (["purge", "--state", ""], ["completed", "dead"]),
    (["dl"], ["dlq"]),
    (["worker", "st"], ["start", "stop"]),
    (["list", "--st"], ["--state"]),
    (["list", "--queue=b"], ["--queue=builds"]),
    (["help", "schedule", "p"], ["pause"]),
]


@pytest.mark.parametrize(("words", "values"), COMPLETED_VALUES)
def test_completion_values(completing_db, words, values):
    assert complete("--db", completing_db, *words) == (0, values)


def test_completion_offers_an_id_that_starts_with_a_dash_only_where_argparse_reads_it_as_one(completing_db):
    """Before `--`, argparse would take `-x` for an option: it is offered after `--` or as --opt=VALUE."""
    ok(completing_db, "enqueue", '{"id": "-x", "command": "true"}')
    everyone = ["build-1", "build-2", "old-1", "tick@2026-12-02T02:00:00Z", "tick@2026-12-02T03:00:00Z"]
    assert complete("--db", completing_db, "show", "") == (0, everyone)
    assert complete("--db", completing_db, "add", "--depends-on", "") == (0, everyone)
    assert complete("--db", completing_db, "show", "--", "") == (0, ["-x", *everyone])
    assert complete("--db", completing_db, "add", "--depends-on=-") == (0, ["--depends-on=-x"])


def test_completion_values_on_both_backends(completing_db):
    """The values read from the queue, with --db given after the command too."""
    assert complete("show", "--db", completing_db, "tick@2026-12-02T0") == (
        0, ["tick@2026-12-02T02:00:00Z", "tick@2026-12-02T03:00:00Z"])
    assert complete("dlq", "retry", "--db", completing_db, "o") == (0, ["old-1"])
    assert complete("--db", completing_db, "pause", "--queue", "") == (
        0, ["builds", "capped", "default", "held", "old"])


def test_completion_command_prints_each_shells_script_and_opens_no_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for shell, line in (("bash", "complete -F _queuectl queuectl"), ("zsh", "compdef _queuectl queuectl"),
                        ("fish", "complete -c queuectl -f -a '(__queuectl_complete)'")):
        code, out, err = run_main(["completion", shell])
        assert (code, err) == (0, "") and line in out and f"__complete {shell}" in out, shell
    code, out, err = run_main(["completion", "tcsh"])
    assert (code, out) == (2, "") and "invalid choice: 'tcsh'" in err
    assert os.listdir(tmp_path) == []


def test_completion_values_are_bounded_index_walks(sqlite_store):
    """Counted in SQLite VM instructions (hundreds), exact on a loaded machine: a scan of these 40,000 jobs
    costs over 1,000; each read here walks a bounded stretch of an index whatever the table holds."""
    sqlite_store.enqueue([spec(f"b{i:05d}", queue="bulk") for i in range(20_000)], T0)
    sqlite_store.enqueue([spec(f"g{i:05d}", queue="gone") for i in range(20_000)], T0)
    sqlite_store.cancel_all("gone", T0)
    scan = _vm_steps(sqlite_store, lambda: sqlite_store.read("SELECT count(*) FROM jobs WHERE command = 'x'"))
    assert scan > 1000
    for prefix in ("", "b01", "zz"):
        assert _vm_steps(sqlite_store, lambda: sqlite_store.complete_ids(prefix)) < 50, prefix
        assert _vm_steps(sqlite_store, lambda: sqlite_store.complete_ids(prefix, dead=True)) < scan / 3, prefix
    assert _vm_steps(sqlite_store, sqlite_store.complete_queues) < 200
    assert sqlite_store.complete_ids("b0100") == [f"b0100{i}" for i in range(10)]
    assert sqlite_store.complete_ids("g1999", dead=True) == [f"g1999{i}" for i in range(10)]
    assert sqlite_store.complete_ids("b0100", dead=True) == []
    assert sqlite_store.complete_queues() == ["bulk", "gone"]


@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_completion_dead_ids_never_walk_past_newer_jobs_on_postgres(db):
    """Old dead jobs under newer ones: PostgreSQL's plan for the newest dead reads at most COMPLETE_WALK rows of
    an index (none walked and filtered away), whatever the table holds."""
    with opened(db) as s:
        s.enqueue([spec(f"x{i:05d}", queue="old") for i in range(2000)], T0)
        s.cancel_all("old", T0)
        s.enqueue([spec(f"b{i:05d}", queue="new") for i in range(6000)], T0)
        s.conn.execute("ANALYZE jobs")
        plan = "\n".join(row[0] for row in s.read("EXPLAIN (ANALYZE, COSTS OFF) " + s.sql.SQL_COMPLETE_DEAD_IDS,
                                                   ("", queuectl.COMPLETE_WALK, queuectl.COMPLETE_WALK, "")))
        removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
        assert removed and max(removed) <= queuectl.COMPLETE_WALK, plan
        assert s.complete_ids("x0199", dead=True) == [f"x0199{i}" for i in range(10)]


def test_completion_files_where_a_path_or_a_command_goes(tmp_path):
    """--db, --cwd and a command after `--` complete file names (the script's exit code 3)."""
    for words in (["--db", "q"], ["list", "--db=q"], ["add", "--cwd", ""], ["add", "--", "ma"],
                  ["add", "--", "ls", "-"]):
        assert complete(*words) == (queuectl.COMPLETE_FILES, []), words


def test_completion_commands_and_options_come_from_the_parser(monkeypatch):
    """A command or option added to build_parser() completes with no other change; the hidden command never."""
    real = queuectl.build_parser

    def more():
        p = real()
        extra = queuectl._subcommands(p).choices["add"]  # the parser `add` builds when named
        extra.add_argument("--notify-me", metavar="CMD")
        return p
    monkeypatch.setattr(queuectl, "build_parser", more)
    assert complete("add", "--no") == (0, ["--notify-me"])
    code, commands = complete("")
    assert code == 0 and "completion" in commands and queuectl.COMPLETE_COMMAND not in commands
    assert set(commands) == set(queuectl._subcommands(real()).choices)
    assert queuectl.COMPLETE_COMMAND not in run_main(["--help"])[1]


@pytest.mark.parametrize("db", ["sqlite", "postgres"], indirect=True)
def test_completion_of_a_missing_queue_creates_nothing(db):
    """A queue that does not exist: no values, no note, and no file or schema made."""
    assert complete("--db", db, "show", "") == (0, [])
    assert complete("--db", db, "list", "--queue", "") == (0, [])
    if is_pg(db):
        import psycopg
        schema = db.rsplit("schema=", 1)[1]
        with psycopg.connect(db.split("?")[0], autocommit=True) as conn:
            assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchall() == []
    else:
        assert not os.path.exists(db) and os.listdir(os.path.dirname(db)) == []


def test_completion_is_silent_on_any_failure(tmp_path, monkeypatch):
    """A database that is not a queue, a folder, an unknown shell: no output and nothing on stderr."""
    (tmp_path / "other.db").write_bytes(b"not a database at all" * 100)
    for words in (["zsh", "--db", str(tmp_path / "other.db"), "show", ""], ["zsh", "--db", str(tmp_path), "show", ""],
                  ["bash"], []):
        code, out, err = run_main(["__complete", *words])
        assert (code, out, err) == (queuectl.EXIT_FAIL, "", ""), words
    monkeypatch.setattr(queuectl, "build_parser", lambda: 1 / 0)
    assert run_main(["__complete", "fish", ""]) == (queuectl.EXIT_FAIL, "", "")


def test_completion_never_writes_not_even_to_upgrade_an_older_schema(db, tmp_path, monkeypatch):
    """A Tab peeks: an older schema is not upgraded (no values), an empty file is not made a queue, and a
    file is byte for byte what it was, with no -wal or -shm left beside it."""
    with monkeypatch.context() as old:
        old.setattr(queuectl, "SCHEMA_VERSION", 4)
        old.setattr(queuectl, "MIGRATIONS", queuectl.MIGRATIONS[:4])
        old.setattr(queuectl, "PG_MIGRATIONS", queuectl.PG_MIGRATIONS[:4])
        with contextlib.closing(queuectl.open_database(db)) as older:
            enqueue_older(older, "old-1")
    files = {} if is_pg(db) else {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert complete("--db", db, "show", "o") == (queuectl.EXIT_FAIL, [])
    assert complete("--db", db, "list", "--queue", "") == (queuectl.EXIT_FAIL, [])
    if is_pg(db):
        import psycopg
        schema = db.rsplit("schema=", 1)[1]
        with psycopg.connect(db.split("?")[0], autocommit=True) as conn:
            assert conn.execute(f"SELECT version FROM {schema}.queuectl_version").fetchall() == [(4,)]
    else:
        assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == files
        (tmp_path / "empty.db").touch()
        assert complete("--db", str(tmp_path / "empty.db"), "show", "") == (queuectl.EXIT_FAIL, [])
        assert (tmp_path / "empty.db").read_bytes() == b"" and sorted(os.listdir(tmp_path)) == ["empty.db", "queue.db"]


def test_completion_gives_up_at_once_on_a_busy_database(db, monkeypatch):
    """A Tab waits for a lock no longer than COMPLETE_BUSY_S (SQLite's busy wait, PostgreSQL's lock_timeout),
    connects within PG_PEEK_CONNECT_TIMEOUT_S, and shows nothing while another process holds the queue."""
    ok(db, "add", "--id", "a-1", "--", "true")
    monkeypatch.setattr(queuectl.PostgresStore, "query_only", None)
    store = queuectl.open_database(db, peek=True, busy_deadline_s=queuectl.COMPLETE_BUSY_S)
    try:
        if is_pg(db):  # read-only from the connection's first round trip: no round trip of its own
            assert store.read("SHOW lock_timeout") == [("50ms",)]
            assert store.read("SHOW transaction_read_only") == [("on",)]
            assert store._connect_params(None)["connect_timeout"] == queuectl.PG_PEEK_CONNECT_TIMEOUT_S == 2
        else:
            assert store.read("PRAGMA busy_timeout") == [(50,)]
    finally:
        store.close()
    with opened(db) as holder:
        if is_pg(db):
            holder.conn.execute("BEGIN")
            holder.conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        else:
            holder.conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            holder.conn.execute("BEGIN EXCLUSIVE")
            holder.conn.execute("DELETE FROM config")
        assert complete("--db", db, "show", "a") == (queuectl.EXIT_FAIL, [])
        holder.conn.execute("ROLLBACK")
    assert complete("--db", db, "show", "a") == (0, ["a-1"])


def test_completion_that_hangs_ends_silently_at_its_deadline(completing_db, monkeypatch):
    """A read that never answers (a server stopped after the connection was made) ends the Tab's process at
    COMPLETE_DEADLINE_S, offering nothing, instead of holding the prompt."""
    ended = []

    def hangs(*_args, **_kwargs):
        threading.Event().wait(WAIT_S)  # interrupted by the deadline's signal, as a blocked read would be
        return []

    def exit_now(code):
        ended.append(code)
        raise SystemExit(code)  # in this test process: end the completion, not pytest
    monkeypatch.setattr(queuectl, "COMPLETE_DEADLINE_S", 0.2)
    monkeypatch.setattr(type(queuectl.open_database(completing_db, peek=True)), "complete_ids", hangs)
    monkeypatch.setattr(queuectl.os, "_exit", exit_now)
    started = time.monotonic()
    assert complete("--db", completing_db, "show", "bu") == (queuectl.EXIT_FAIL, [])
    assert ended == [queuectl.EXIT_FAIL] and time.monotonic() - started < WAIT_S
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left behind


@sqlite_only
def test_completion_honours_queuectl_db_and_the_line(completing_db, tmp_path, monkeypatch):
    """$QUEUECTL_DB names the queue unless the line gives --db."""
    monkeypatch.setenv("QUEUECTL_DB", completing_db)
    assert complete("show", "bu") == (0, ["build-1", "build-2"])
    assert complete("--db", str(tmp_path / "none.db"), "show", "bu") == (0, [])


# Each shell's script, loaded in that shell and asked for completions of a real line. The program they run is
# `queuectl` on PATH: the file as users install it.
COMPLETION_SHELLS = ("bash", "zsh", "fish")


def _shell_or_skip(shell):
    if shutil.which(shell) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{shell} is missing; CI must run the completion tests (apt-get install {shell})")
        pytest.skip(f"completion test skipped: {shell} not found (apt-get install {shell})")


def bash_completion(script, line, env):
    """What bash's function answers for `line` (the cursor at its end): COMPREPLY as given, each value
    completed to the whole word (bash gives the part after the last COMP_WORDBREAKS character)."""
    word = re.split(r"[\s\"'@><=;|&(:]", line)[-1]  # readline's word, as bash passes it in $2
    program = ('source "$1"; COMP_LINE=$2; COMP_POINT=${#2}; read -ra COMP_WORDS <<<"$2"; '
               'COMP_CWORD=${#COMP_WORDS[@]}; _queuectl queuectl "$3" ""; printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program, "bash", script, line, word],
                          capture_output=True, text=True, timeout=WAIT_S, env=env)
    assert (done.returncode, done.stderr) == (0, ""), done
    whole = shlex.split(line + "x")[-1][:-1]
    return [whole[:len(whole) - len(word)] + shlex.split(v)[0] for v in done.stdout.splitlines() if v]


def zsh_completion(script, line, env):
    """What zsh's function adds for `line` (compadd stubbed to print what it is given)."""
    program = ('source "$1"; shift; compadd() { [[ $1 == -- ]] && shift; (( $# )) && print -rl -- "$@"; }; '
               'compset() { :; }; _files() { print -r -- "(files)"; }; '
               'words=("$@"); CURRENT=$#; PREFIX=${words[-1]}; _queuectl')
    words = shlex.split(line + "x")
    words[-1] = words[-1][:-1]
    done = subprocess.run(["zsh", "-f", "-c", program, "zsh", script, *words], capture_output=True, text=True,
                          timeout=WAIT_S, env=env)
    assert done.stderr == "", done
    return done.stdout.splitlines()


def fish_completion(script, line, env):
    """What fish offers for `line` (`complete -C`), without descriptions."""
    done = subprocess.run(["fish", "--no-config", "-c", 'source $argv[1]; complete -C $argv[2]', script, line],
                          capture_output=True, text=True, timeout=WAIT_S, env=env)
    assert (done.returncode, done.stderr) == (0, ""), done
    return [v.split("\t")[0] for v in done.stdout.splitlines()]


def _completion_script(program, env, tmp_path, shell):
    """The file of `shell`'s script as the installed `program` prints it."""
    script = tmp_path / f"queuectl.{shell}"
    script.write_text(subprocess.run([str(program), "completion", shell], capture_output=True, text=True, env=env,
                                     check=True, timeout=WAIT_S).stdout)
    return script


@pytest.fixture
def installed_queuectl(tmp_path):
    """(a `queuectl` installed on PATH, its environment)."""
    program = _installed(tmp_path)
    return program, _launcher_env(tmp_path, PATH=f"{program.parent}{os.pathsep}{os.environ.get('PATH', '')}")


@sqlite_only
@pytest.mark.parametrize("shell", COMPLETION_SHELLS)
def test_completion_in_each_shell(completing_db, installed_queuectl, tmp_path, shell):
    _shell_or_skip(shell)
    program, env = installed_queuectl
    script = _completion_script(program, env, tmp_path, shell)
    asked = {"bash": bash_completion, "zsh": zsh_completion, "fish": fish_completion}[shell]
    env["QUEUECTL_DB"] = str(tmp_path / "elsewhere.db")  # the line's --db wins
    db = f"--db {completing_db}"
    for words, values in COMPLETED_VALUES:
        line = f"queuectl {db} {shlex.join(words[:-1])} {words[-1]}".replace("  ", " ")
        assert sorted(asked(str(script), line, env)) == values, (shell, line)
    assert asked(str(script), "queuectl show tick@2026-12-02T03", env) == []  # $QUEUECTL_DB: no queue there
    env["QUEUECTL_DB"] = completing_db
    assert asked(str(script), "queuectl show tick@2026-12-02T03", env) == ["tick@2026-12-02T03:00:00Z"]
    missing = tmp_path / "missing" / "queue.db"
    missing.parent.mkdir()
    assert asked(str(script), f"queuectl --db {missing} dlq retry ", env) == []
    assert os.listdir(missing.parent) == []
    # File names: bash's -o default (readline's own, not in this call), zsh's _files, fish's paths
    files = {"bash": ([], []), "zsh": (["(files)"], ["(files)"]), "fish": ([str(script)], [f"--db={script}"])}[shell]
    assert asked(str(script), f"queuectl add --queue q -- {str(script)[:-2]}", env) == files[0]
    assert asked(str(script), f"queuectl --db={str(script)[:-2]}", env) == files[1]


def _tab_shows(shell, setup, typed, expected, env, keys="\t"):
    """Type `typed` and a Tab (or `keys`) in an interactive `shell` on a terminal, and wait until `expected`
    shows."""
    import pty
    import select
    argv = {"bash": ["bash", "--norc", "--noprofile", "-i"], "zsh": ["zsh", "-f", "-i"]}[shell]
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    screen = bytearray()

    def shows(text):
        while select.select([fd], [], [], 0.05)[0]:
            try:
                screen.extend(os.read(fd, 65536))
            except OSError:
                break
        return text.encode() in screen
    try:
        os.write(fd, f"PS1='ready> '; {setup}\n".encode())
        wait_for(lambda: shows("ready> "), f"{shell}'s prompt")
        screen.clear()
        os.write(fd, f"{typed}{keys}".encode())
        wait_for(lambda: shows(expected), f"{shell} completing {typed!r} to {expected!r}")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


@sqlite_only
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_at_a_real_tab(completing_db, installed_queuectl, tmp_path, shell):
    """Readline (bash) and zle (zsh) on a terminal: an id with ":" and "@" completes in place after a Tab (the
    screen shows the line as typed, then what the Tab inserted: a value put after bash's ":" again would not)."""
    _shell_or_skip(shell)
    program, env = installed_queuectl
    env.update(QUEUECTL_DB=completing_db, HOME=str(tmp_path))
    script = _completion_script(program, env, tmp_path, shell)
    setup = {"bash": f"source {script}",
             "zsh": f"autoload -U compinit; compinit -u -d {tmp_path}/zcompdump; source {script}"}[shell]
    _tab_shows(shell, setup, "queuectl show tick@2026-12-02T02:0", "show tick@2026-12-02T02:00:00Z", env)
    _tab_shows(shell, setup, "queuectl dlq re", "dlq retry", env)


HOSTILE_ID = """it's "a $(touch pwned) `touch pwned`" \\ !x"""  # quotes, expansions, a backslash, history's !


@sqlite_only
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_at_a_real_tab_inserts_an_id_the_shell_reads_back_whole(completing_db, installed_queuectl,
                                                                           tmp_path, shell):
    """A Tab then Enter runs `show` with the id itself, whether the word was begun bare, in '...' or in "...";
    nothing in it is expanded or run."""
    _shell_or_skip(shell)
    program, env = installed_queuectl
    env.update(QUEUECTL_DB=completing_db, HOME=str(tmp_path))
    ok(completing_db, "add", "--id", HOSTILE_ID, "--", "true")
    script = _completion_script(program, env, tmp_path, shell)
    setup = {"bash": f"cd {tmp_path}; source {script}",
             "zsh": f"cd {tmp_path}; autoload -U compinit; compinit -u -d {tmp_path}/zcompdump; source {script}"}[shell]
    for begun in ("it", "'it", '"it'):
        _tab_shows(shell, setup, f"queuectl show {begun}", f"id:           {HOSTILE_ID}", env, keys="\t\r")
    assert not list(tmp_path.glob("pwned*"))


@sqlite_only
def test_completion_in_fish_reads_the_word_as_typed_unescaped(completing_db, installed_queuectl, tmp_path):
    """fish gives the word under the cursor as typed (escapes, quotes): it is unescaped before it is matched."""
    _shell_or_skip("fish")
    program, env = installed_queuectl
    env["QUEUECTL_DB"] = completing_db
    ok(completing_db, "add", "--id", HOSTILE_ID, "--", "true")
    script = _completion_script(program, env, tmp_path, "fish")
    for begun in ("it\\'s\\ ", "'it\\'s \"a", '"it\'s \\"a \\$'):
        assert fish_completion(str(script), f"queuectl show {begun}", env) == [HOSTILE_ID], begun


@sqlite_only
def test_completion_in_bash_replaces_only_readline_word(completing_db, installed_queuectl, tmp_path):
    """bash splits an id at ':' and '@' (COMP_WORDBREAKS) and replaces only the part after the last one:
    its values are that part, and characters special to the shell come escaped."""
    _shell_or_skip("bash")
    program, env = installed_queuectl
    script = _completion_script(program, env, tmp_path, "bash")
    env["QUEUECTL_DB"] = completing_db
    ok(completing_db, "add", "--id", "a b$", "--", "true")
    line = "queuectl show tick@2026-12-02T02:"
    program = ('source "$1"; COMP_LINE=$2; COMP_POINT=${#2}; _queuectl queuectl "$3" ""; '
               'printf "%s\\n" "${COMPREPLY[@]}"')
    for line, word, values in (("queuectl show tick@2026-12-02T02:", "", ["00:00Z"]),
                               ("queuectl show tick@2026-12-02T0", "2026-12-02T0", ["2026-12-02T02:00:00Z",
                                                                                    "2026-12-02T03:00:00Z"]),
                               ("queuectl show a", "a", ["a\\ b\\$"])):
        done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program, "bash", str(script), line, word],
                              capture_output=True, text=True, timeout=WAIT_S, env=env)
        assert (done.returncode, done.stdout.splitlines(), done.stderr) == (0, values, ""), line


# ==== Benchmark (bench/) ==========================================================================

@pytest.fixture(scope="module")
def bench():
    return _load_bench()


def test_bench_a_figure_that_was_not_measured_is_never_a_pass(bench):
    # A peak RSS read as 0.0 MB (the worker's memory already gone) or not read at all is no measurement.
    for value in (None, 0.0, 0, -1.0, float("nan"), float("inf")):
        assert bench.verdict("memory_rss", value) == bench.NOT_MEASURED, value
    assert bench.verdict("memory_rss", 30.0) == "pass"
    assert bench.verdict("memory_rss", 41.0) == "fail"
    assert bench.verdict("memory_rss", 30.0, why="the worker exited before /proc could be read") == bench.NOT_MEASURED
    # Rates, durations and ratios of zero are failed readings too; only latencies from enqueue exit
    # (a job can start before its enqueue exits) and idle costs are measured at zero or below.
    for key in ("tsp_ratio", "cpu_ratio", "batch_rate", "scale_status", "scale_pickup_p50_ratio"):
        assert bench.verdict(key, 0.0) == bench.NOT_MEASURED, key
    assert bench.verdict("pickup_ack_p50", -3.9) == "pass"
    assert bench.verdict("idle_pct", 0.0) == "pass"
    assert bench.verdict("drain_rate", 0.0) is None  # no target, no verdict
    # Empty samples and missing inputs give no figure, not a zero or a crash.
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert bench.ratio(1.0, None) is None and bench.ratio(None, 2.0) is None and bench.ratio(1.0, 0.0) is None


def test_bench_cpu_ratio_is_the_workers_cpu_less_its_idle_cpu_against_the_loops(bench, tmp_path):
    b = bench.Bench({"seed": 1}, str(tmp_path))
    b.raw["drain"] = {}
    drains = [{"self_cpu_s": 0.9, "idle_cpu_s": 0.1}, {"self_cpu_s": 1.3, "idle_cpu_s": 0.3}]
    bench.cpu_figure(b, drains, [0.2, 0.25], 1000)  # 0.8 / 0.2 and 1.0 / 0.25 ms a job
    [figure] = b.results
    assert (figure["key"], figure["value"], figure["verdict"]) == ("cpu_ratio", 4.0, "fail")
    assert "worker 0.900 ms, loop 0.225 ms a job" in figure["detail"]
    bench.cpu_figure(b, [{"self_cpu_s": None, "idle_cpu_s": 0.1}], [0.2], 1000)  # a worker gone before /proc was read
    assert b.results[-1]["value"] is None and b.results[-1]["verdict"] == bench.NOT_MEASURED


def test_bench_report_shows_unmeasured_figures_and_tiny_mode_gives_no_verdict(bench, tmp_path):
    meta = {"date": "2026-01-01 00:00 UTC", "queuectl": "test", "cores": 2, "cpu": "", "disk": "", "python": "3",
            "sqlite": "3", "other_load": "unknown", "mode": "full", "params": {}}
    for verdicts in (True, False):
        b = bench.Bench({"seed": 1}, str(tmp_path), verdicts=verdicts)
        b.add("memory_rss", "peak RSS", 0.0, "MB")
        b.add("idle_pct", "idle", 0.2, "%")
        b.add("tsp_ratio", "drain / task-spooler", 0.5, "x")
        b.add("batch_rate", "batch", None, "jobs/s", why="`enqueue -` missing")
        report = bench.render({**meta, "verdicts": verdicts}, b.results, [])
        rss = next(line for line in report.splitlines() if line.startswith("| peak RSS"))
        assert bench.NOT_MEASURED in rss and "0.0 MB" not in rss and "pass" not in rss, rss
        if verdicts:
            assert [r["verdict"] for r in b.results] == [bench.NOT_MEASURED, "pass", "fail", bench.NOT_MEASURED]
            assert [r["pass"] for r in b.results] == [None, True, False, None]
            assert "targets met: 1 of 4 (2 not measured, so not met)" in report
            assert bench.verdicts_found(b.results, report)
        else:
            assert all(r["verdict"] is None and r["pass"] is None for r in b.results)
            assert report.count(bench.NO_VERDICT) == 1
            assert not re.search(r"pass|FAIL|targets met", report), report
            assert bench.verdicts_found(b.results, report) == []


def test_bench_rejects_counts_that_would_leave_an_empty_sample(bench, capsys):
    for option in ("--pickup-jobs", "--jobs", "--repeats", "--memory-jobs", "--idle-seconds"):
        with pytest.raises(SystemExit):
            bench.parse_args([option, "0"])
    assert bench.main(["--tiny", "--check"]) == 2
    assert "no verdict" in capsys.readouterr().err
