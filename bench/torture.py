#!/usr/bin/env python3
"""Torture run: queuectl under crashes and contention must lose nothing and never overlap a job.

On a temporary database, several enqueuers (processes running `enqueue -` batches and single
`enqueue JSON`) add jobs while 3-4 worker processes (`worker start --count 1..3`) run them. Every
0.2-2 s a random worker is killed: mostly SIGKILL, sometimes SIGTERM (now and then a second SIGTERM:
the hard stop), sometimes `worker stop` (which asks every worker); a new worker replaces it.

Each job's command runs under `flock -n` on a lock file named after its id, so a second run of the
same job while the first is alive fails loudly (an OVERLAP line). The kernel drops such a lock when
its holder dies, so a killed run cannot leave a false overlap behind. A run that gets past its lock
appends `$QUEUECTL_JOB_ID` to a results file. Job kinds: quick jobs; flaky jobs that fail their first
k attempts and then succeed (backoff is set to 1 s); jobs whose first attempt times out; jobs meant
to fail for good (exit 3) or to time out every time; a few depend on an earlier job.

At the end the killing stops, the last workers are stopped, and `worker start --burst` drains the
queue. Then, with no timing in any check:
  - every acknowledged job is in the database (lost = 0) and none is pending, failed or processing;
  - a dead job is dead only for a reason the run allows: meant to fail, always times out, the
    lost-worker cap ("worker lost"), or a dead dependency; each counted;
  - no OVERLAP line (overlaps = 0);
  - every completed job's id is in the results file; a job's extra result lines (reruns) are
    explained by its own runs that were cut short after it started (outcome lost or stopped): at
    most one extra line per such run;
  - no run is left open, PRAGMA integrity_check is ok (PostgreSQL: the invariant queries below),
    `status --json` counts equal the rows;
  - no worker exited on its own or printed a traceback, and no enqueue failed except "busy" and a
    child refused because its dependency is dead (or was refused itself): it is sent again without it;
  - before the run, an orphan-kill probe: runs under flock are killed with kill_run() and wait_gone() (the
    sweeper's step before a requeue) and /proc/locks must show their lock gone when it returns
    (a dying run still holding it is the overlap above, caught in its millisecond window).
A summary follows (jobs, kills by kind, recoveries = runs with outcome 'lost', reruns, overlaps, lost);
exit 1 on any violation.

With --pg URL (a PostgreSQL server), the run uses a fresh schema of that server (?schema=torture_<hex>)
instead of an SQLite file: every process gets the schema's URL as --db, the checks read the rows through
queuectl's Store, and the schema is dropped at the end (on failure too, after the run's workers are
killed). PostgreSQL has no PRAGMA integrity_check; in its place, queries check invariants the rows must
keep (INVARIANTS: no run or dependency of a missing job, known states only, unique ids, each job's
run_count equal to its runs numbered 1..run_count, a completed job's last run completed, an open run
exactly for each processing job) and that no index of the schema is invalid. The orphan-kill probe does
not touch the database and is skipped (the SQLite run covers it). Enqueues that exit "database is
busy" are sent again on both backends (PostgreSQL's after transactions kept conflicting).

  python3 bench/torture.py                 # the long form: 300 s of chaos (make torture)
  python3 bench/torture.py --short         # about 20-25 s in all, same checks (make test)
  python3 bench/torture.py --seconds 60 --seed 7 --json
  python3 bench/torture.py --short --pg postgresql://postgres@127.0.0.1:5432/postgres
"""

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUECTL = os.path.join(ROOT, "queuectl.py")  # run() points this at a copy taken when the run starts
PY = sys.executable
OVERLAP_EXIT = 75  # flock's exit code when the lock is held; no job body uses it

# kind -> share of the jobs
KINDS = {"quick": 0.62, "flaky": 0.2, "slow_first": 0.04, "doomed": 0.06, "always_timeout": 0.02, "child": 0.06}


def log(msg: str) -> None:
    print(f"torture: {msg}", file=sys.stderr, flush=True)


# ==== PostgreSQL mode ===============================================================================

def is_pg(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def with_schema(server: str, schema: str) -> str:
    """The server's URL naming `schema` (any schema= it had is replaced)."""
    parts = urlsplit(server)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query + [("schema", schema)])))


def without_schema(url: str) -> str:
    """The URL for libpq (psycopg): queuectl's `schema` parameter removed."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def shown(db: str) -> str:
    """The database as messages show it: a URL without its password."""
    if not is_pg(db):
        return db
    parts = urlsplit(db)
    if parts.password is None:
        return db
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def drop_schema(url: str) -> None:
    """Drop the run's schema with everything in it (nothing to do if it was never made)."""
    import psycopg
    from psycopg import sql as pgsql
    schema = dict(parse_qsl(urlsplit(url).query))["schema"]
    with psycopg.connect(without_schema(url), autocommit=True, connect_timeout=30) as conn:
        conn.execute("SET lock_timeout = '30s'")  # a leftover session holding a lock fails loudly
        conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))


def load_queuectl(path: str):
    """The queuectl module from `path` (the run's copy), for kill_run() and the Store; loaded once."""
    if path in _MODULES:
        return _MODULES[path]
    import importlib.util
    spec = importlib.util.spec_from_file_location("queuectl_torture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[path] = module
    return module


_MODULES: dict = {}


# What PostgreSQL checks in place of PRAGMA integrity_check: each query counts the rows that break one
# invariant, and must give 0. Plain SQL that SQLite runs too.
INVARIANTS = {
    "runs of a job that does not exist":
        "SELECT count(*) FROM runs r WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = r.job_id)",
    "dependency rows naming a job that does not exist":
        "SELECT count(*) FROM deps d WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.job_id) "
        "OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.dep_id)",
    "jobs in an unknown state":
        "SELECT count(*) FROM jobs WHERE state NOT IN ('pending', 'processing', 'completed', 'failed', 'dead')",
    "duplicate job ids or seqs":
        "SELECT (count(*) - count(DISTINCT id)) + (count(*) - count(DISTINCT seq)) FROM jobs",
    "jobs whose run_count is not the number of their runs, numbered 1..run_count":
        "SELECT count(*) FROM jobs j WHERE j.run_count <> (SELECT count(*) FROM runs r WHERE r.job_id = j.id) "
        "OR j.run_count <> coalesce((SELECT max(run_no) FROM runs r WHERE r.job_id = j.id), 0) "
        "OR EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id AND r.run_no < 1)",
    "completed jobs whose last run did not complete":
        "SELECT count(*) FROM jobs j WHERE j.state = 'completed' AND NOT EXISTS "
        "(SELECT 1 FROM runs r WHERE r.job_id = j.id AND r.run_no = j.run_count AND r.outcome = 'completed')",
    "processing jobs without an open run, or open runs not their job's processing one":
        "SELECT (SELECT count(*) FROM jobs j WHERE j.state = 'processing' AND NOT EXISTS "
        "(SELECT 1 FROM runs r WHERE r.job_id = j.id AND r.run_no = j.run_count AND r.outcome IS NULL)) + "
        "(SELECT count(*) FROM runs r WHERE r.outcome IS NULL AND NOT EXISTS (SELECT 1 FROM jobs j "
        "WHERE j.id = r.job_id AND j.state = 'processing' AND j.run_count = r.run_no))",
}
PG_INVALID_INDEXES = ("SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                      "JOIN pg_namespace n ON n.oid = c.relnamespace "
                      "WHERE n.nspname = current_schema() AND NOT (i.indisvalid AND i.indisready)")


def pg_integrity(store) -> str:
    """'ok', or the invariants the rows break (with how many rows break each)."""
    broken = [f"{name}: {n}" for name, sql in INVARIANTS.items() if (n := store.read(sql)[0][0])]
    if n := store.read(PG_INVALID_INDEXES)[0][0]:
        broken.append(f"invalid indexes: {n}")
    return "; ".join(broken) or "ok"


# ==== the plan: every job decided up front from the seed ==========================================

def job_command(kind: str, k: int, sleep_s: float, paths: dict) -> str:
    """The shell command of a job: the flock guard around a body that appends its result line."""
    result = f'echo "$QUEUECTL_JOB_ID" >> {paths["results"]}'
    bodies = {
        "quick": f"{result}; sleep {sleep_s}",
        "child": f"{result}; sleep {sleep_s}",
        "flaky": f'[ "$QUEUECTL_ATTEMPT" -le {k} ] && exit 1; {result}; sleep {sleep_s}',
        "slow_first": f'[ "$QUEUECTL_ATTEMPT" -eq 1 ] && sleep 30; {result}; sleep {sleep_s}',
        "doomed": f"sleep {sleep_s}; exit 3",
        "always_timeout": "sleep 30",
    }
    lock = os.path.join(paths["locks"], "$QUEUECTL_JOB_ID")
    return (f"flock -n -E {OVERLAP_EXIT} \"{lock}\" -c '{bodies[kind]}'; rc=$?; "
            f'if [ $rc -eq {OVERLAP_EXIT} ]; then echo "OVERLAP $QUEUECTL_JOB_ID" >> {paths["overlaps"]}; fi; '
            "exit $rc")


def make_plan(rng: random.Random, n: int, enqueuers: int, paths: dict) -> list[list[dict]]:
    """Job specs per enqueuer, in the order each enqueuer sends them."""
    per: list[list[dict]] = [[] for _ in range(enqueuers)]
    kinds, weights = list(KINDS), list(KINDS.values())
    for i in range(n):
        e = i % enqueuers
        kind = rng.choices(kinds, weights)[0]
        if kind == "child" and not per[e]:
            kind = "quick"
        k = rng.randint(1, 3)
        job = {"id": f"t{i:05d}", "command": job_command(kind, k, round(rng.uniform(0, 0.4), 2), paths),
               "cwd": paths["dir"], "max_retries": {"flaky": k + 1, "slow_first": 3, "doomed": 2}.get(kind, 1),
               "_kind": kind}
        if kind in ("slow_first", "always_timeout"):
            job["timeout"] = 1
        if kind == "child":
            job["depends_on"] = [rng.choice(per[e][-20:])["id"]]  # sent earlier by the same enqueuer
        per[e].append(job)
    return per


# ==== enqueuers ====================================================================================

class Enqueuers:
    """Threads that each run `queuectl enqueue` processes (batches on stdin, or one job) over a window."""

    def __init__(self, db: str, plan: list[list[dict]], window_s: float, seed: int):
        self.db, self.plan, self.window_s, self.seed = db, plan, window_s, seed
        self.acknowledged: set[str] = set()
        self.refused: dict[str, tuple[str, str]] = {}  # child id -> (its dependency, why it was refused)
        self.busy_retries = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stopped = False  # set by stop(), under the lock: no enqueue process starts after it
        self.procs: set = set()  # the enqueue processes running now
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(plan))]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, deadline: float) -> bool:
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def stop(self) -> None:
        """Kill the enqueue processes running and start no more (a run that failed midway: its
        PostgreSQL schema is about to be dropped, and an enqueue would make it again)."""
        with self.lock:
            self.stopped = True
            running = list(self.procs)
        for proc in running:
            proc.kill()
        for t in self.threads:
            t.join(10)

    def _run(self, index: int) -> None:
        with contextlib.suppress(Stopped):
            self._send_all(index)

    def _send_all(self, index: int) -> None:
        rng = random.Random(f"{self.seed}:enqueuer:{index}")
        jobs = self.plan[index]
        started, sent = time.monotonic(), 0
        while sent < len(jobs):
            size = 1 if rng.random() < 0.3 else rng.randint(2, 60)
            chunk = jobs[sent:sent + size]
            self._send(chunk, single=len(chunk) == 1 and rng.random() < 0.8)
            sent += len(chunk)
            # keep pace with the window: the jobs arrive while workers run and die
            due = started + self.window_s * sent / len(jobs)
            time.sleep(max(0.0, due - time.monotonic()))

    def _send(self, chunk: list[dict], single: bool) -> None:
        specs = [{k: v for k, v in job.items() if not k.startswith("_")} for job in chunk]
        while specs:
            p = self._enqueue(specs, single)
            refused = self._refusal(p)
            if refused is None:
                break
            specs = [s for s in specs if s["id"] != refused]  # the rest again, without it
        else:
            return
        printed = p.stdout.decode().split()
        expected = [s["id"] for s in specs]
        with self.lock:
            if p.returncode != 0 or printed != expected:
                self.errors.append(f"enqueue of {expected[0]}..{expected[-1]} exit {p.returncode}, printed "
                                   f"{printed[:3]}..., stderr {p.stderr.decode()[:300]!r}")
            if p.returncode == 0:
                self.acknowledged.update(printed)

    def _enqueue(self, specs: list[dict], single: bool) -> subprocess.CompletedProcess:
        if single:
            argv, data = ["enqueue", json.dumps(specs[0])], None
        else:
            argv, data = ["enqueue", "-"], "".join(json.dumps(s) + "\n" for s in specs).encode()
        while True:
            p = self._spawn([PY, QUEUECTL, "--db", self.db] + argv, data)
            if p.returncode == 1 and b"database is busy" in p.stderr:
                with self.lock:
                    self.busy_retries += 1  # nothing was stored: the same jobs again
                continue
            return p

    def _spawn(self, argv: list[str], data: bytes | None) -> subprocess.CompletedProcess:
        """subprocess.run(argv, input=data, capture_output=True, timeout=120), killable by stop()."""
        with self.lock:
            if self.stopped:
                raise Stopped
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.procs.add(proc)
        try:
            out, err = proc.communicate(data, timeout=120)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            with self.lock:
                self.procs.discard(proc)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def _refusal(self, p: subprocess.CompletedProcess) -> str | None:
        """The child a refused enqueue names when its dependency is dead (or was itself refused, so
        does not exist); recorded for check(), which verifies the reason. None for anything else."""
        match = re.search(r"job '(t\d+)' depends on '(t\d+)', which (is dead|does not exist)", p.stderr.decode())
        if p.returncode != 1 or match is None:
            return None
        with self.lock:
            self.refused[match[1]] = (match[2], match[3])
        return match[1]


class Stopped(Exception):
    """An enqueuer told to stop (Enqueuers.stop)."""


# ==== workers and the killer =======================================================================

class Workers:
    """The worker processes: started, killed, stopped and replaced; every exit accounted for."""

    def __init__(self, db: str, logs: str, rng: random.Random):
        self.db, self.logs, self.rng = db, logs, rng
        self.procs: list[dict] = []  # {"proc", "count", "asked": None|"sigterm"|"hard"|"stop"|"sigkill"}
        self.started = 0
        self.kills = {"sigkill": 0, "sigterm": 0, "sigterm_twice": 0, "worker_stop": 0}
        self.unexpected: list[str] = []
        self.exits: dict[str, int] = {}

    def start(self, count: int | None = None, burst: bool = False) -> subprocess.Popen:
        count = count or self.rng.randint(1, 3)
        self.started += 1
        out = open(os.path.join(self.logs, f"worker-{self.started:04d}.log"), "wb")  # noqa: SIM115
        argv = [PY, QUEUECTL, "--db", self.db, "worker", "start", "--count", str(count)] + (["--burst"] if burst else [])
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        self.procs.append({"proc": proc, "count": count, "asked": None, "burst": burst, "log": out.name})
        return proc

    @staticmethod
    def logged(w: dict, text: bytes) -> bool:
        with open(w["log"], "rb") as f:
            return text in f.read()

    def ready(self, w: dict) -> bool:
        """Registered, so its signal handlers are installed (a SIGTERM before that would just kill it)."""
        return self.logged(w, b"worker started")

    def wait_logged(self, w: dict, text: bytes, deadline: float) -> bool:
        while w["proc"].poll() is None and time.monotonic() < deadline:
            if self.logged(w, text):
                return True
            time.sleep(0.02)
        return self.logged(w, text)

    def active(self) -> list[dict]:
        """Workers running and not asked to stop."""
        return [w for w in self.procs if w["asked"] is None and w["proc"].poll() is None]

    def reap(self) -> None:
        """Forget exited workers; an exit nobody asked for is a violation."""
        for w in list(self.procs):
            code = w["proc"].poll()
            if code is None:
                continue
            self.procs.remove(w)
            key = f"{w['asked'] or ('burst' if w['burst'] else 'unasked')}:{code}"
            self.exits[key] = self.exits.get(key, 0) + 1
            expected = {"sigkill": {-9}, "sigterm": {0}, "hard": {0, 130}, "stop": {0}, None: {0} if w["burst"] else set()}
            # A SIGTERM that lands after a graceful exit finished (the interpreter is tearing down and
            # has restored the default action) ends the process with -15: harmless then. Two cases: the
            # second SIGTERM of a hard stop, and the final stop_all's SIGTERM to a worker that was
            # already leaving after `worker stop`.
            if w["asked"] in ("hard", "stop") and code == -signal.SIGTERM and self.logged(w, b"worker exited"):
                continue
            if code not in expected[w["asked"]]:
                self.unexpected.append(f"worker pid {w['proc'].pid} (asked {w['asked']}) exited {code}")

    def strike(self) -> str:
        """Kill or stop one random active worker (or all, for `worker stop`), then replace it."""
        targets = self.active()
        if not targets:
            return "none"
        w = self.rng.choice(targets)
        roll = self.rng.random()
        if 0.7 <= roll < 0.85 and not self.ready(w):
            roll = 0.0  # SIGTERM only once its handlers are installed; SIGKILL does not care
        if roll < 0.7:
            w["asked"] = "sigkill"
            w["proc"].send_signal(signal.SIGKILL)
            kind = "sigkill"
        elif roll < 0.85:
            w["asked"] = "sigterm"
            w["proc"].send_signal(signal.SIGTERM)
            kind = "sigterm"
            # The hard stop. The second SIGTERM waits until the first was handled: two identical standard
            # signals sent back to back merge into one delivery while the first is still pending.
            if self.rng.random() < 0.35:
                w["asked"] = "hard"
                if self.wait_logged(w, b"stopping (signal)", time.monotonic() + 10) and w["proc"].poll() is None:
                    w["proc"].send_signal(signal.SIGTERM)
                kind = "sigterm_twice"
        else:
            p = subprocess.run([PY, QUEUECTL, "--db", self.db, "worker", "stop"], capture_output=True, timeout=60)
            if p.returncode != 0:
                self.unexpected.append(f"worker stop exit {p.returncode}: {p.stderr.decode()[:200]}")
            for t in targets:
                t["asked"] = "stop"
            kind = "worker_stop"
        self.kills[kind] += 1
        return kind

    def top_up(self) -> None:
        want = self.rng.choice((3, 4))
        while len(self.active()) < want:
            self.start()

    def stop_all(self, deadline: float) -> None:
        """SIGTERM every worker (once registered) and wait; whatever is still alive at the deadline gets SIGKILL."""
        for w in self.procs:
            self.wait_logged(w, b"worker started", deadline)
        for w in self.procs:
            if w["proc"].poll() is None and w["asked"] in (None, "stop"):  # the others are already stopping
                w["asked"] = w["asked"] or "sigterm"
                w["proc"].send_signal(signal.SIGTERM)
        while any(w["proc"].poll() is None for w in self.procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        for w in self.procs:
            if w["proc"].poll() is None:
                log(f"worker {w['proc'].pid} did not stop in time: SIGKILL")
                self.unexpected.append(f"worker pid {w['proc'].pid} did not stop within 60 s of SIGTERM")
                w["asked"] = "sigkill"
                w["proc"].kill()
                w["proc"].wait()
        self.reap()


# ==== the orphan-kill probe =========================================================================

def probe_orphan_kill(queuectl_path: str, folder: str, n: int) -> int:
    """How many of n runs still hold their flock right after kill_run() and wait_gone() return.

    This is the step a sweeper takes before it requeues a dead worker's job: if the killed
    processes are still dying when it returns, the rerun can find the old run's lock held (the
    overlap the torture run counts, in a window of milliseconds). Each probe starts a run under
    `flock` carrying a QUEUECTL_RUN token, waits until /proc/locks shows the lock, calls
    kill_run(token), wait_gone() and looks at /proc/locks at once. 0 is the only right answer.
    """
    module = load_queuectl(queuectl_path)
    lock = os.path.join(folder, "probe.lock")
    open(lock, "w").close()
    tag = f":{os.stat(lock).st_ino} "

    def held() -> bool:
        with open("/proc/locks") as f:
            return any(tag in line for line in f)
    still = 0
    for i in range(n):
        token = f"torture-probe/{os.getpid()}/{i}"
        proc = subprocess.Popen(["/bin/sh", "-c", f"flock -n {lock} -c 'sleep 30'"], start_new_session=True,
                                env=dict(os.environ, QUEUECTL_RUN=token))
        deadline = time.monotonic() + 10
        while not held() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.001)
        module.wait_gone(module.kill_run(token), 5.0)
        still += held()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while held() and time.monotonic() < deadline:
            time.sleep(0.001)
    return still


# ==== the run ======================================================================================

def run(seconds: float, jobs: int, enqueuers: int, seed: int, keep: bool = False,
        kill_interval: tuple[float, float] = (0.2, 2.0), drain_deadline_s: float = 600.0, probes: int = 100,
        pg: str | None = None) -> dict:
    """One torture run; returns the summary (with "violations": a list, empty when all held).
    pg: a PostgreSQL server's URL; the run then uses a fresh schema there, dropped at the end."""
    if pg is None:
        return _run(seconds, jobs, enqueuers, seed, keep, kill_interval, drain_deadline_s, probes, None)
    url = with_schema(pg, f"torture_{uuid.uuid4().hex}")
    started: list = []  # the run's Workers and Enqueuers, once made
    try:
        return _run(seconds, jobs, enqueuers, seed, keep, kill_interval, drain_deadline_s, probes, url, started)
    finally:
        # Left running only when the run failed: stop them, so none holds a lock or makes the schema again.
        for part in started:
            if isinstance(part, Enqueuers):
                part.stop()
            else:
                for w in part.procs:
                    if w["proc"].poll() is None:
                        w["proc"].kill()
                        w["proc"].wait()
        try:
            drop_schema(url)
        except Exception as e:  # noqa: BLE001 - reported, never hiding the run's own outcome
            log(f"could not drop the schema of {shown(url)}: {e}")


def _run(seconds: float, jobs: int, enqueuers: int, seed: int, keep: bool, kill_interval: tuple[float, float],
         drain_deadline_s: float, probes: int, url: str | None, started: list | None = None) -> dict:
    global QUEUECTL
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="queuectl-torture-")
    # Every process of the run uses a copy of queuectl.py taken now: edits made to the file while
    # the run goes on cannot mix two versions in one run.
    QUEUECTL = shutil.copy(os.path.join(ROOT, "queuectl.py"), os.path.join(tmp, "queuectl.py"))
    paths = {"dir": tmp, "db": url or os.path.join(tmp, "q.db"), "results": os.path.join(tmp, "results"),
             "overlaps": os.path.join(tmp, "overlaps"), "locks": os.path.join(tmp, "locks"),
             "logs": os.path.join(tmp, "logs")}
    os.makedirs(paths["locks"])
    os.makedirs(paths["logs"])
    for f in ("results", "overlaps"):
        open(paths[f], "w").close()
    for key, value in (("backoff-base", "1"), ("backoff-max", "1")):
        cli(paths["db"], "config", "set", key, value)
    plan = make_plan(rng, jobs, enqueuers, paths)
    kinds = {job["id"]: job["_kind"] for part in plan for job in part}
    parents = {job["id"]: job["depends_on"][0] for part in plan for job in part if "depends_on" in job}
    workers = Workers(paths["db"], paths["logs"], rng)
    enq = Enqueuers(paths["db"], plan, seconds * 0.7, seed)
    if started is not None:
        started += [workers, enq]
    if url is None:
        still_locked = probe_orphan_kill(QUEUECTL, tmp, probes)
        log(f"orphan-kill probe: {still_locked} of {probes} killed runs still held their lock when kill_run() and wait_gone() returned")
    else:
        still_locked, probes = 0, 0
        log("orphan-kill probe skipped on PostgreSQL: it does not touch the database (the SQLite run covers it)")
    began = time.monotonic()
    log(f"db {shown(paths['db'])}: {jobs} jobs, {enqueuers} enqueuers, {seconds:g}s of kills every "
        f"{kill_interval[0]:g}-{kill_interval[1]:g}s (seed {seed})")
    workers.top_up()
    enq.start()
    next_strike = time.monotonic() + rng.uniform(*kill_interval)
    last_report = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(0.05)
        workers.reap()
        if time.monotonic() >= next_strike:
            workers.strike()
            workers.top_up()
            next_strike = time.monotonic() + rng.uniform(*kill_interval)
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            log(f"{time.monotonic() - began:.0f}s: {len(enq.acknowledged)} acknowledged, kills {workers.kills}")
    log("chaos over: waiting for the enqueuers, stopping the workers")
    enqueued_all = enq.join(time.monotonic() + 120)
    workers.stop_all(time.monotonic() + 60)
    drain_started = time.monotonic()
    drained = drain(paths["db"], workers, time.monotonic() + drain_deadline_s)
    drain_s = time.monotonic() - drain_started
    summary = check(paths, kinds, parents, enq, workers, drained and enqueued_all)
    summary["orphan_kill_probe"] = {"runs": probes, "still_locked": still_locked}
    if url is not None:
        summary["backend"] = "postgresql"
    if still_locked:
        summary["violations"].append(
            f"orphan-kill probe: {still_locked} of {probes} runs still held their flock right after kill_run() and wait_gone() "
            "returned: a sweeper that requeues then lets the rerun overlap the dying run")
    summary.update(seconds=seconds, seed=seed, total_s=round(time.monotonic() - began, 1), drain_s=round(drain_s, 1),
                   kill_interval_s=list(kill_interval), machine=machine(url))
    if not enqueued_all:
        summary["violations"].append("the enqueuers did not finish within 120 s after the chaos")
    if summary["violations"] or keep:
        summary["kept"] = tmp
        log(f"kept {tmp} for inspection")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def cli(db: str, *argv: str) -> subprocess.CompletedProcess:
    p = subprocess.run([PY, QUEUECTL, "--db", db, *argv], capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"queuectl {' '.join(argv)}: exit {p.returncode}: {p.stderr.decode()}")
    return p


def drain(db: str, workers: Workers, deadline: float) -> bool:
    """Burst workers until nothing is left to run (a burst exits when nothing is due or running).
    At least one runs: its sweeper also clears the rows of the workers that were killed."""
    first = True
    while time.monotonic() < deadline:
        if not first and not unfinished(db):
            return True
        first = False
        proc = workers.start(count=4, burst=True)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        workers.reap()
    return not unfinished(db)


def unfinished(db: str) -> int:
    if is_pg(db):
        with pg_store(db) as store:
            return store.read("SELECT count(*) FROM jobs WHERE state NOT IN ('completed', 'dead')")[0][0]
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('completed', 'dead')").fetchone()[0]


@contextlib.contextmanager
def pg_store(url: str):
    """queuectl's Store (of the run's copy) on the run's schema, for the checks' reads."""
    store = load_queuectl(QUEUECTL).open_database(url, reads_only=True)
    try:
        yield store
    finally:
        store.close()


# ==== the checks ===================================================================================

def check(paths: dict, kinds: dict, parents: dict, enq: Enqueuers, workers: Workers, drained: bool) -> dict:
    v: list[str] = []
    if is_pg(paths["db"]):
        with pg_store(paths["db"]) as store:
            rows = {r[0]: r[1:] for r in store.read("SELECT id, state, last_error, attempts, lost_count FROM jobs")}
            runs_rows = store.read("SELECT job_id, coalesce(outcome, 'open'), count(*) FROM runs GROUP BY job_id, outcome")
            integrity = pg_integrity(store)  # no PRAGMA integrity_check: the invariants and the indexes
            by_state = dict(store.read("SELECT state, count(*) FROM jobs GROUP BY state"))
    else:
        conn = sqlite3.connect(paths["db"])
        rows = {r[0]: r[1:] for r in conn.execute("SELECT id, state, last_error, attempts, lost_count FROM jobs")}
        runs_rows = conn.execute("SELECT job_id, coalesce(outcome, 'open'), count(*) FROM runs "
                                 "GROUP BY job_id, outcome").fetchall()
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        by_state = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
        conn.close()
    runs: dict[str, dict] = {}
    for job_id, outcome, n in runs_rows:
        runs.setdefault(job_id, {})[outcome] = n
    with open(paths["results"]) as f:
        lines = f.read().split()
    with open(paths["overlaps"]) as f:
        overlaps = [line for line in f.read().splitlines() if line.strip()]
    results: dict[str, int] = {}
    for job_id in lines:
        results[job_id] = results.get(job_id, 0) + 1

    for child, (parent, why) in enq.refused.items():  # refused enqueues: only on a dead or refused dependency
        if not (parent in enq.refused if why == "does not exist" else rows.get(parent, ("",))[0] == "dead"):
            v.append(f"enqueue of {child} was refused because {parent} {why}, which is not so")
    lost = sorted(enq.acknowledged - set(rows))
    if lost:
        v.append(f"{len(lost)} acknowledged jobs are missing: {lost[:10]}")
    if set(rows) - enq.acknowledged:
        v.append(f"jobs stored but never acknowledged: {sorted(set(rows) - enq.acknowledged)[:10]}")
    if not drained:
        v.append("the final drain did not finish within its deadline")
    unfinished_jobs = {i: r[0] for i, r in rows.items() if r[0] not in ("completed", "dead")}
    if unfinished_jobs:
        v.append(f"{len(unfinished_jobs)} jobs not terminal at the end: {dict(list(unfinished_jobs.items())[:10])}")
    dead_reasons = {"meant_to_fail": 0, "always_timeout": 0, "lost_worker_cap": 0, "dead_dependency": 0}
    for job_id, (state, error, attempts, lost_count) in rows.items():
        if state != "dead":
            continue
        kind, error = kinds.get(job_id), error or ""
        if error.startswith("worker lost"):
            dead_reasons["lost_worker_cap"] += 1
        elif kind == "doomed" and error == "exit code 3":
            dead_reasons["meant_to_fail"] += 1
        elif kind == "always_timeout" and error.startswith("timed out"):
            dead_reasons["always_timeout"] += 1
        elif error.startswith("dependency ") and rows.get(parents.get(job_id, ""), ("",))[0] == "dead":
            dead_reasons["dead_dependency"] += 1
        else:
            v.append(f"job {job_id} ({kind}) is dead for a reason the run does not allow: {error!r}")
    if overlaps:
        v.append(f"{len(overlaps)} overlapping runs: {overlaps[:10]}")
    reruns, extra_lines = 0, 0
    for job_id, (state, *_rest) in rows.items():
        n = results.get(job_id, 0)
        cut = runs.get(job_id, {}).get("lost", 0) + runs.get(job_id, {}).get("stopped", 0)
        if state == "completed" and n == 0:
            v.append(f"job {job_id} is completed but its result line is missing")
        if n > 1:
            reruns += 1
            extra_lines += n - 1
        if n > 1 + cut:
            v.append(f"job {job_id} wrote {n} result lines but only {cut} of its runs were cut short "
                     f"(runs: {runs.get(job_id)}): it ran again after completing a run")
    open_runs = sum(r.get("open", 0) for r in runs.values())
    if open_runs:
        v.append(f"{open_runs} runs are still open")
    if integrity != "ok":
        v.append(f"{'invariants' if is_pg(paths['db']) else 'PRAGMA integrity_check'}: {integrity}")
    status = json.loads(cli(paths["db"], "status", "--json").stdout)
    expected_counts = {s: by_state.get(s, 0) for s in ("pending", "processing", "completed", "failed", "dead")}
    if status["jobs"] != expected_counts:
        v.append(f"status --json {status['jobs']} != rows {expected_counts}")
    if status.get("active_workers"):
        v.append(f"status reports {status['active_workers']} live workers after every worker exited")
    v += [f"enqueue: {e}" for e in enq.errors]
    v += [f"worker: {u}" for u in workers.unexpected]
    tracebacks = [name for name in sorted(os.listdir(paths["logs"]))
                  if b"Traceback" in open(os.path.join(paths["logs"], name), "rb").read()]
    if tracebacks:
        v.append(f"tracebacks in worker logs: {tracebacks[:5]}")
    outcomes: dict[str, int] = {}
    for r in runs.values():
        for k, n in r.items():
            outcomes[k] = outcomes.get(k, 0) + n
    return {
        "jobs": len(rows), "acknowledged": len(enq.acknowledged), "completed": by_state.get("completed", 0),
        "dead": by_state.get("dead", 0), "dead_by_reason": dead_reasons,
        "kills": dict(workers.kills, total=sum(workers.kills.values())), "worker_starts": workers.started,
        "worker_exits": workers.exits,
        "recoveries": outcomes.get("lost", 0), "hard_stopped_runs": outcomes.get("stopped", 0),
        "runs": sum(outcomes.values()), "run_outcomes": outcomes,
        "reruns": reruns, "rerun_lines": extra_lines, "overlaps": len(overlaps), "lost": len(lost),
        "enqueue_busy_retries": enq.busy_retries, "refused_enqueues": len(enq.refused), "integrity": integrity,
        "violations": v,
    }


def machine(url: str | None = None) -> dict:
    """Where and on what the run happened (the queuectl.py digest names the code that was tortured)."""
    with open(QUEUECTL, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    found = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cores": os.cpu_count(),
             "queuectl_sha256": digest,
             "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
             "kernel": platform.release(), "flock": shutil.which("flock") is not None}
    if url is not None:
        with pg_store(url) as store:
            found["postgresql"] = store.read("SHOW server_version")[0][0]
    return found


def print_summary(s: dict) -> None:
    k = s["kills"]
    print(f"torture: {s['jobs']} jobs ({s['completed']} completed, {s['dead']} dead: "
          + ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in s["dead_by_reason"].items()) + ")")
    print(f"  kills: {k['total']} ({k['sigkill']} SIGKILL, {k['sigterm']} SIGTERM, {k['sigterm_twice']} SIGTERM twice "
          f"(hard stop), {k['worker_stop']} `worker stop`); {s['worker_starts']} workers started")
    print(f"  runs: {s['runs']}; recoveries (runs lost with their worker): {s['recoveries']}; "
          f"hard-stopped runs: {s['hard_stopped_runs']}")
    print(f"  reruns: {s['reruns']} completed jobs wrote their result more than once ({s['rerun_lines']} extra lines), "
          "each explained by a run of its own cut short by a kill or hard stop after it started")
    probe = s["orphan_kill_probe"]
    pg = s.get("backend") == "postgresql"
    if pg:
        print("  orphan-kill probe: skipped on PostgreSQL (it does not touch the database; the SQLite run covers it)")
    else:
        print(f"  orphan-kill probe: {probe['still_locked']} of {probe['runs']} killed runs still held their lock when "
              "kill_run() and wait_gone() returned (must be 0)")
    integrity = "invariants" if pg else "integrity"
    print(f"  overlaps: {s['overlaps']} (must be 0)   lost: {s['lost']} (must be 0)   {integrity}: {s['integrity']}   "
          f"busy enqueue retries: {s['enqueue_busy_retries']}   enqueues refused on a dead dependency: "
          f"{s['refused_enqueues']}")
    m = s["machine"]
    print(f"  {s['seconds']:g}s of chaos, drain {s['drain_s']}s, {s['total_s']}s in all; seed {s['seed']}; "
          f"{m['date']}, {m['cores']} cores, Python {m['python']}, "
          + (f"PostgreSQL {m['postgresql']}, " if pg else f"SQLite {m['sqlite']}, ") +
          f"queuectl.py sha256 {m['queuectl_sha256']}")
    for violation in s["violations"]:
        print(f"  VIOLATION: {violation}")
    print("torture: " + ("FAILED" if s["violations"] else "ok"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="seconds of kills (default 300)")
    p.add_argument("--jobs", type=int, help="jobs in all (default: 14 per second of chaos, at least 200)")
    p.add_argument("--enqueuers", type=int, default=3, help="concurrent enqueuers (default 3)")
    p.add_argument("--short", action="store_true",
                   help="about 20-25 s in all, for make test: 16 s of kills every 0.2-1 s, 450 jobs "
                   "(with --pg: 12 s, 300 jobs, as each process costs more)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill-every", type=float, nargs=2, default=(0.2, 2.0), metavar=("MIN", "MAX"),
                   help="seconds between kills (default 0.2 2)")
    p.add_argument("--probes", type=int, default=100, help="orphan-kill probes before the run (default 100)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (db, logs, results)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    p.add_argument("--pg", metavar="URL", help="run on this PostgreSQL server (postgresql://USER@HOST:PORT/DB), "
                   "in a fresh schema torture_<hex> dropped at the end; needs psycopg 3")
    args = p.parse_args(argv)
    if shutil.which("flock") is None:
        print("torture: needs flock(1) (util-linux)", file=sys.stderr)
        return 2
    if args.pg is not None and not is_pg(args.pg):
        print("torture: --pg takes a postgresql:// URL", file=sys.stderr)
        return 2
    if args.short:
        args.seconds, args.jobs = (12.0, args.jobs or 300) if args.pg else (16.0, args.jobs or 450)
        args.kill_every = (0.2, 1.0) if tuple(args.kill_every) == (0.2, 2.0) else args.kill_every
    jobs = args.jobs or max(200, int(args.seconds * 14))
    summary = run(args.seconds, jobs, args.enqueuers, args.seed, args.keep, tuple(args.kill_every),
                  drain_deadline_s=120.0 if args.short else 600.0, probes=args.probes, pg=args.pg)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
