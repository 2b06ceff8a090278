#!/usr/bin/env python3
"""queuectl: a persistent background job queue for shell commands, in one SQLite file.

Enqueue jobs as JSON, run foreground workers that claim and run them, retry failures with
exponential backoff, and keep jobs that exhaust their retries in a dead-letter queue (DLQ).
A worker killed with SIGKILL loses nothing: another worker recovers its jobs.

commands:
  enqueue JSON            add a job, e.g. '{"id": "a", "command": "echo hi"}'
  worker start|stop       run workers in the foreground / ask every worker to stop
  status, list, show, logs
  dlq list|retry          the dead-letter queue
  config set|get|list     max-retries, backoff-base, backoff-max, stale-timeout, job-timeout
"""

# Heavy modules (subprocess, threading, signal, select) are imported only by the worker code
# that needs them: every command pays for what it imports, and `enqueue` should start fast.
import argparse
import contextlib
import json
import logging
import math
import os
import socket
import sqlite3
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

__version__ = "1.0.0"

log = logging.getLogger("queuectl")


# ==== Constants ==================================================================================

PENDING, PROCESSING, COMPLETED, FAILED, DEAD = "pending", "processing", "completed", "failed", "dead"
STATES = (PENDING, PROCESSING, COMPLETED, FAILED, DEAD)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130

SCHEMA_VERSION = 1
APPLICATION_ID = 0x51435431  # "QCT1": marks a SQLite file as a queuectl database

MAX_COMMAND_BYTES = 131_071  # Linux MAX_ARG_STRLEN (one argv string) less its terminating NUL
MAX_ID_CHARS = 200
MAX_RETRIES_LIMIT = 1_000_000
MAX_SECONDS = 10 * 365 * 86400  # caps timeouts and delays: keeps every number finite and storable
OUTPUT_TAIL_BYTES = 64 * 1024
LOST_WORKER_CAP = 3  # a job whose worker is lost this many times goes to the DLQ
BURST_HORIZON_S = 60.0  # --burst waits for jobs due within this many seconds
POLL_INTERVAL_S = 0.05  # how often an idle worker process checks for due jobs
SWEEP_INTERVAL_S = 1.0  # how often each worker process looks for dead workers
BUSY_TIMEOUT_S = 1.0  # SQLite's own busy wait per attempt; we retry on top of it
CLI_BUSY_DEADLINE_S = 5.0  # a CLI command gives up (exit 1) after retrying this long


def _parse_number(text: str, *, integer: bool = False) -> float | int:
    """Parse a finite number from a config string; integers only when asked."""
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise UsageError(f"not {'an integer' if integer else 'a number'}: {text!r}") from None
    if not math.isfinite(value) or abs(value) > MAX_SECONDS * 10:
        raise UsageError(f"number out of range: {text!r}")
    return int(value) if value == int(value) else value


def _check(value: float, ok: bool, rule: str) -> float:
    if not ok:
        raise UsageError(f"value {value:g} must be {rule}")
    return value


# key -> (default, validator taking the CLI string and returning the stored value)
CONFIG = {
    "max_retries": (3, lambda s: _check(v := _parse_number(s, integer=True), 0 <= v <= MAX_RETRIES_LIMIT,
                                        f"an integer from 0 to {MAX_RETRIES_LIMIT}")),
    "backoff_base": (2, lambda s: _check(v := _parse_number(s), 1 <= v <= 1000, "from 1 to 1000")),
    "backoff_max": (3600, lambda s: _check(v := _parse_number(s), 0 <= v <= MAX_SECONDS, "seconds >= 0")),
    "stale_timeout": (10, lambda s: _check(v := _parse_number(s), 0 < v <= 86400, "seconds > 0, at most 86400")),
    "job_timeout": (0, lambda s: _check(v := _parse_number(s), 0 <= v <= MAX_SECONDS, "seconds >= 0 (0 = none)")),
}


# ==== Errors =====================================================================================

class QueueError(Exception):
    """A failure a user can cause; main() prints it as one line and exits with `exit_code`."""
    exit_code = EXIT_FAIL


class UsageError(QueueError):
    """Invalid input: nothing was changed."""
    exit_code = EXIT_USAGE


class NotFound(QueueError):
    """No job or worker with that id."""


class Conflict(QueueError):
    """The job exists but is in the wrong state for the request, or the id is taken."""


class Busy(QueueError):
    """The database stayed locked by another process for longer than we wait."""


class BadDatabase(QueueError):
    """The file is not a queuectl database this version can use."""


# ==== Model ======================================================================================

def iso(t: float | None) -> str | None:
    """Epoch seconds -> ISO-8601 UTC with milliseconds and a Z, for output."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Job:
    """One job row."""
    id: str
    command: str
    state: str
    attempts: int
    max_retries: int
    timeout: float
    cwd: str
    env: dict
    created_at: float
    updated_at: float
    next_run_at: float
    last_error: str | None
    exit_code: int | None
    worker_id: str | None
    run_count: int
    lost_count: int

    COLUMNS = ("id, command, state, attempts, max_retries, timeout_s, cwd, env, created_at, updated_at, "
               "next_run_at, last_error, exit_code, worker_id, run_count, lost_count")

    @classmethod
    def from_row(cls, row: tuple) -> "Job":
        """Build a Job from a row selected with Job.COLUMNS."""
        values = list(row)
        values[7] = json.loads(values[7])
        return cls(*values)

    def to_dict(self) -> dict:
        """The job as users see it in --json output."""
        d = dict(self.__dict__)
        for key in ("created_at", "updated_at", "next_run_at"):
            d[key] = iso(d[key])
        return d


@dataclass
class Outcome:
    """What one run of a job's command came to."""
    exit_code: int | None
    error: str | None
    output: str
    duration_s: float
    interrupted: bool = False  # the worker stopped it (hard stop, lost claim): not the job's failure


# ==== Storage ====================================================================================

MIGRATIONS = [
    # 1: jobs, their runs, workers, config. `seq` gives enqueue order; the partial index serves the
    # claim and the poller exactly (WHERE state IN (...) ORDER BY next_run_at, seq LIMIT 1).
    """
    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        command TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL,
        timeout_s REAL NOT NULL,
        cwd TEXT NOT NULL,
        env TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        next_run_at REAL NOT NULL,
        last_error TEXT,
        exit_code INTEGER,
        worker_id TEXT,
        run_count INTEGER NOT NULL DEFAULT 0,
        lost_count INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_due ON jobs (next_run_at, seq) WHERE state IN ('pending', 'failed');
    CREATE INDEX jobs_state ON jobs (state, seq);
    CREATE INDEX jobs_worker ON jobs (worker_id) WHERE state = 'processing';
    CREATE TABLE runs (
        job_id TEXT NOT NULL,
        run_no INTEGER NOT NULL,
        worker_id TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        exit_code INTEGER,
        error TEXT,
        output TEXT,
        PRIMARY KEY (job_id, run_no)
    );
    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        proc_start TEXT,
        boot_id TEXT,
        pid_ns TEXT,
        threads INTEGER NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        beat INTEGER NOT NULL DEFAULT 0,
        stop_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
]

SQL_INSERT_JOB = (
    "INSERT INTO jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at, next_run_at) "
    "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)")
SQL_GET_JOB = f"SELECT {Job.COLUMNS} FROM jobs WHERE id = ?"
SQL_LIST_JOBS = f"SELECT {Job.COLUMNS} FROM (SELECT * FROM jobs {{where}} ORDER BY seq DESC LIMIT ?) ORDER BY seq"
SQL_COUNTS = "SELECT state, count(*) FROM jobs GROUP BY state"
# The claim: one statement, atomic inside BEGIN IMMEDIATE. The subquery walks the jobs_due index.
SQL_DUE = "SELECT id FROM jobs WHERE state IN ('pending', 'failed') AND next_run_at <= ? ORDER BY next_run_at, seq LIMIT 1"
# A worker whose registration was removed (presumed dead) cannot claim: its jobs would be orphans.
SQL_REGISTERED = "SELECT 1 FROM workers WHERE id = ?"
SQL_CLAIM = (
    "UPDATE jobs SET state = 'processing', worker_id = ?, run_count = run_count + 1, updated_at = ? "
    f"WHERE id = ({SQL_DUE}) AND EXISTS ({SQL_REGISTERED}) RETURNING {Job.COLUMNS}")
SQL_CLAIM_ID = ("UPDATE jobs SET state = 'processing', worker_id = ?, run_count = run_count + 1, updated_at = ? "
                "WHERE id = ? AND state IN ('pending', 'failed')")
SQL_NEXT_DUE = "SELECT min(next_run_at) FROM jobs WHERE state IN ('pending', 'failed')"
SQL_ANY_PROCESSING = "SELECT 1 FROM jobs WHERE state = 'processing' LIMIT 1"
SQL_INSERT_RUN = "INSERT INTO runs (job_id, run_no, worker_id, started_at) VALUES (?, ?, ?, ?)"
# Every write after the claim is guarded by the owner and run number, so a worker that lost the
# job (declared dead, then came back) can never overwrite what happened since.
SQL_FINISH_JOB = (
    "UPDATE jobs SET state = ?, attempts = ?, next_run_at = ?, last_error = ?, exit_code = ?, "
    "worker_id = NULL, updated_at = ? WHERE id = ? AND state = 'processing' AND worker_id = ? AND run_count = ?")
SQL_FINISH_RUN = "UPDATE runs SET ended_at = ?, exit_code = ?, error = ?, output = ? WHERE job_id = ? AND run_no = ?"
SQL_REQUEUE = (
    "UPDATE jobs SET state = ?, lost_count = lost_count + ?, last_error = coalesce(?, last_error), "
    "next_run_at = ?, worker_id = NULL, updated_at = ? "
    "WHERE id = ? AND state = 'processing' AND worker_id = ? AND run_count = ?")
SQL_JOBS_OF_WORKER = "SELECT id, run_count, lost_count FROM jobs WHERE state = 'processing' AND worker_id = ?"
SQL_ORPHAN_JOBS = ("SELECT id, run_count, lost_count, worker_id FROM jobs WHERE state = 'processing' "
                   "AND worker_id NOT IN (SELECT id FROM workers)")
SQL_LAST_RUN = "SELECT output FROM runs WHERE job_id = ? ORDER BY run_no DESC LIMIT 1"
SQL_RETRY = ("UPDATE jobs SET state = 'pending', attempts = 0, lost_count = 0, next_run_at = ?, "
             "last_error = NULL, exit_code = NULL, updated_at = ? WHERE id = ? AND state = 'dead'")
SQL_REGISTER = ("INSERT INTO workers (id, host, pid, proc_start, boot_id, pid_ns, threads, started_at, heartbeat_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
SQL_HEARTBEAT = "UPDATE workers SET heartbeat_at = ?, beat = beat + 1 WHERE id = ?"
SQL_STOP_REQUESTED = "SELECT stop_requested FROM workers WHERE id = ?"
SQL_DEREGISTER = "DELETE FROM workers WHERE id = ?"
SQL_DROP_DEAD_WORKER = ("DELETE FROM workers WHERE id = ? AND NOT EXISTS "
                        "(SELECT 1 FROM jobs WHERE state = 'processing' AND worker_id = ?)")
SQL_WORKERS = "SELECT id, host, pid, proc_start, boot_id, pid_ns, heartbeat_at, beat, stop_requested FROM workers"
SQL_REQUEST_STOP = "UPDATE workers SET stop_requested = 1"
SQL_CONFIG_GET = "SELECT value FROM config WHERE key = ?"
SQL_CONFIG_SET = "INSERT INTO config (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
SQL_CONFIG_ALL = "SELECT key, value FROM config"

HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


@dataclass
class WorkerRow:
    """A registered worker process as stored."""
    id: str
    host: str
    pid: int
    proc_start: str | None
    boot_id: str | None
    pid_ns: str | None
    heartbeat_at: float
    beat: int
    stop_requested: int


def _create_private(path: str) -> None:
    """Create the database file 0600 before SQLite does (it gives -wal and -shm the same mode).

    Only when it is missing: closing *any* descriptor of an open SQLite file drops every POSIX
    lock this process holds on it, so reopening an existing file here would silently unlock the
    other connections of a worker process and let two of them write at once.
    """
    if os.path.exists(path):
        return
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))


class Store:
    """The one place that talks SQL: every read and write of the queue goes through here."""

    def __init__(self, path: str, *, durable: bool = True, busy_deadline_s: float = CLI_BUSY_DEADLINE_S):
        self.path = path
        self.busy_deadline_s = busy_deadline_s
        self.conn = self._connect(path)
        # FULL syncs the WAL on every commit: an enqueue that printed its id survives a power cut.
        # Workers use NORMAL: a lost worker write only means a job runs again (at-least-once).
        self.conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        self._migrate()

    # -- opening --------------------------------------------------------------------------------

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        try:
            _create_private(path)
            return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise BadDatabase(f"cannot open database {path}: {getattr(e, 'strerror', None) or e}") from None

    def _migrate(self) -> None:
        """Check the file is ours, then bring the schema up to date; safe against concurrent first opens."""
        self._check_identity()
        if self._read_version() == SCHEMA_VERSION:
            return
        self._retry(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
        self.write(self._apply_migrations)

    def _read_version(self) -> int:
        return self._retry(lambda: self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _check_identity(self) -> None:
        def read():
            app, = self.conn.execute("PRAGMA application_id").fetchone()
            tables, = self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return app, tables, self.conn.execute("PRAGMA user_version").fetchone()[0]
        app, tables, version = self._retry(read)
        if app != APPLICATION_ID and (app != 0 or tables or version):
            raise BadDatabase(f"{self.path} is not a queuectl database")
        if version > SCHEMA_VERSION:
            raise BadDatabase(f"{self.path} has schema version {version}, newer than this queuectl "
                              f"({__version__}, schema {SCHEMA_VERSION}); upgrade queuectl")

    def _apply_migrations(self, cur: sqlite3.Cursor) -> None:
        # Re-read inside BEGIN IMMEDIATE: another process may have migrated while we waited.
        version = cur.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in filter(str.strip, script.split(";")):
                cur.execute(statement)
            cur.execute(f"PRAGMA user_version = {number}")
        cur.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    # -- transactions ---------------------------------------------------------------------------

    def _retry(self, fn):
        """Run fn, retrying `database is locked` with a short random backoff until the deadline.

        busy_timeout alone does not prevent it (SQLite's busy handler can be starved), so a CLI
        command retries a few seconds and then reports Busy; a worker passes a long deadline.
        """
        import random
        deadline = time.monotonic() + self.busy_deadline_s
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise Busy(f"database is busy: {self.path} stayed locked by another process; "
                               "try again") from None
                time.sleep(random.uniform(0.005, 0.05))

    def write(self, fn):
        """Run fn(cursor) inside BEGIN IMMEDIATE (the write lock up front, so no upgrade deadlock)."""
        def attempt():
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                result = fn(cur)
                cur.execute("COMMIT")
                return result
            except BaseException:
                self.conn.rollback()
                raise
        return self._retry(attempt)

    def read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run one read-only statement with busy retries."""
        return self._retry(lambda: self.conn.execute(sql, params).fetchall())

    # -- jobs -----------------------------------------------------------------------------------

    def enqueue(self, spec: dict, now: float) -> Job:
        """Insert a validated job spec; Conflict if the id is taken."""
        def insert(cur):
            try:
                cur.execute(SQL_INSERT_JOB, (spec["id"], spec["command"], spec["max_retries"], spec["timeout"],
                                             spec["cwd"], json.dumps(spec["env"]), now, now, now))
            except sqlite3.IntegrityError:
                raise Conflict(f"job {spec['id']!r} already exists") from None
            return Job.from_row(cur.execute(SQL_GET_JOB, (spec["id"],)).fetchone())
        return self.write(insert)

    def get(self, job_id: str) -> Job:
        """One job; NotFound if absent."""
        rows = self.read(SQL_GET_JOB, (job_id,))
        if not rows:
            raise NotFound(f"no job with id {job_id!r}")
        return Job.from_row(rows[0])

    def list_jobs(self, state: str | None = None, limit: int = -1) -> list[Job]:
        """Jobs oldest first; with a limit, the newest `limit` of them."""
        where, params = ("WHERE state = ?", (state,)) if state else ("", ())
        return [Job.from_row(r) for r in self.read(SQL_LIST_JOBS.format(where=where), params + (limit,))]

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (all five keys)."""
        counts = dict.fromkeys(STATES, 0)
        counts.update(self.read(SQL_COUNTS))
        return counts

    def last_output(self, job_id: str) -> str | None:
        """Output tail of the job's latest run, or None if it never ran."""
        self.get(job_id)
        rows = self.read(SQL_LAST_RUN, (job_id,))
        return rows[0][0] if rows else None

    def next_due_at(self) -> float | None:
        """When the earliest pending or failed job becomes due (cheap: one index probe)."""
        return self.read(SQL_NEXT_DUE)[0][0]

    def burst_done(self, now: float) -> bool:
        """True when nothing is processing anywhere and nothing is due within the burst horizon."""
        due = self.next_due_at()
        return not self.read(SQL_ANY_PROCESSING) and (due is None or due > now + BURST_HORIZON_S)

    def claim(self, worker_id: str, now: float) -> Job | None:
        """Atomically take the earliest due job for this worker and open its run record."""
        def take(cur):
            if HAS_RETURNING:
                row = cur.execute(SQL_CLAIM, (worker_id, now, now, worker_id)).fetchone()
            else:
                row = self._claim_without_returning(cur, worker_id, now)
            if row is None:
                return None
            job = Job.from_row(row)
            cur.execute(SQL_INSERT_RUN, (job.id, job.run_count, worker_id, now))
            return job
        return self.write(take)

    @staticmethod
    def _claim_without_returning(cur: sqlite3.Cursor, worker_id: str, now: float) -> tuple | None:
        # SQLite < 3.35: select then update, still one BEGIN IMMEDIATE transaction, so no other
        # writer can slip in between; the state guard makes the update a no-op if it somehow did.
        if cur.execute(SQL_REGISTERED, (worker_id,)).fetchone() is None:
            return None
        found = cur.execute(SQL_DUE, (now,)).fetchone()
        if found is None or cur.execute(SQL_CLAIM_ID, (worker_id, now, found[0])).rowcount != 1:
            return None
        return cur.execute(SQL_GET_JOB, (found[0],)).fetchone()

    def finish(self, job: Job, worker_id: str, outcome: Outcome, settings: dict, now: float) -> Job | None:
        """Record a run's outcome; None if this worker no longer owns the job (nothing written)."""
        state, attempts, next_run_at = failure_rule(job, outcome, settings, now)
        def record(cur):
            cur.execute(SQL_FINISH_JOB, (state, attempts, next_run_at, outcome.error, outcome.exit_code, now,
                                         job.id, worker_id, job.run_count))
            if cur.rowcount != 1:
                return None
            cur.execute(SQL_FINISH_RUN, (now, outcome.exit_code, outcome.error, outcome.output, job.id, job.run_count))
            return self._get_in(cur, job.id)
        return self.write(record)

    def release(self, job: Job, worker_id: str, outcome: Outcome, now: float) -> bool:
        """Give an interrupted job back as pending, attempts unchanged (the worker was stopped)."""
        def put_back(cur):
            cur.execute(SQL_REQUEUE, (PENDING, 0, None, now, now, job.id, worker_id, job.run_count))
            if cur.rowcount != 1:
                return False
            cur.execute(SQL_FINISH_RUN, (now, outcome.exit_code, outcome.error, outcome.output, job.id, job.run_count))
            return True
        return self.write(put_back)

    @staticmethod
    def _get_in(cur: sqlite3.Cursor, job_id: str) -> Job:
        return Job.from_row(cur.execute(SQL_GET_JOB, (job_id,)).fetchone())

    def retry_dead(self, job_ids: list[str], now: float) -> None:
        """Move dead jobs back to pending; all or nothing."""
        def revive(cur):
            for job_id in job_ids:
                row = cur.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    raise NotFound(f"no job with id {job_id!r}")
                if row[0] != DEAD:
                    raise Conflict(f"job {job_id!r} is {row[0]}, not dead")
                cur.execute(SQL_RETRY, (now, now, job_id))
        self.write(revive)

    # -- workers --------------------------------------------------------------------------------

    def register(self, worker_id: str, identity: dict, threads: int, now: float) -> None:
        """Add this worker process to the workers table."""
        self.write(lambda cur: cur.execute(SQL_REGISTER, (
            worker_id, identity["host"], identity["pid"], identity["proc_start"], identity["boot_id"],
            identity["pid_ns"], threads, now, now)))

    def heartbeat(self, worker_id: str, now: float) -> bool | None:
        """Refresh our heartbeat; returns whether a stop was requested, or None if our row is gone."""
        def beat(cur):
            if cur.execute(SQL_HEARTBEAT, (now, worker_id)).rowcount != 1:
                return None
            return bool(cur.execute(SQL_STOP_REQUESTED, (worker_id,)).fetchone()[0])
        return self.write(beat)

    def deregister(self, worker_id: str) -> None:
        """Remove this worker's row (on a clean exit)."""
        self.write(lambda cur: cur.execute(SQL_DEREGISTER, (worker_id,)))

    def workers(self) -> list[WorkerRow]:
        """Every registered worker."""
        return [WorkerRow(*r) for r in self.read(SQL_WORKERS)]

    def request_stop(self) -> int:
        """Ask every registered worker to stop; returns how many were asked."""
        return self.write(lambda cur: cur.execute(SQL_REQUEST_STOP).rowcount)

    def jobs_of(self, worker_id: str) -> list[tuple]:
        """(id, run_count, lost_count) of the jobs a worker holds."""
        return self.read(SQL_JOBS_OF_WORKER, (worker_id,))

    def orphan_jobs(self) -> list[tuple]:
        """(id, run_count, lost_count, worker_id) of processing jobs whose worker is not registered."""
        return self.read(SQL_ORPHAN_JOBS)

    def recover(self, job_id: str, worker_id: str, run_no: int, lost_count: int, now: float) -> str | None:
        """Requeue a job whose worker died (not an attempt); dead after LOST_WORKER_CAP losses."""
        state, error = recovery_rule(lost_count + 1)
        def requeue(cur):
            cur.execute(SQL_REQUEUE, (state, 1, error, now, now, job_id, worker_id, run_no))
            if cur.rowcount != 1:
                return None
            cur.execute(SQL_FINISH_RUN, (now, None, "worker lost", None, job_id, run_no))
            return state
        return self.write(requeue)

    def drop_worker(self, worker_id: str) -> None:
        """Forget a dead worker once it holds no job."""
        self.write(lambda cur: cur.execute(SQL_DROP_DEAD_WORKER, (worker_id, worker_id)))

    # -- config ---------------------------------------------------------------------------------

    def config_get(self, key: str) -> float | int:
        """A config value (stored or default)."""
        rows = self.read(SQL_CONFIG_GET, (key,))
        return json.loads(rows[0][0]) if rows else CONFIG[key][0]

    def config_all(self) -> dict:
        """Every config value, defaults filled in."""
        stored = {k: json.loads(v) for k, v in self.read(SQL_CONFIG_ALL)}
        return {key: stored.get(key, default) for key, (default, _) in CONFIG.items()}

    def config_set(self, key: str, value: float | int) -> None:
        """Store a validated config value."""
        self.write(lambda cur: cur.execute(SQL_CONFIG_SET, (key, json.dumps(value))))


# ==== Core rules =================================================================================

def backoff_delay(attempts: int, base: float, cap: float) -> float:
    """Seconds to wait before retry number `attempts`: min(base ** attempts, cap), overflow-safe."""
    if base <= 1:
        return min(1.0, cap) if base == 1 else 0.0
    if attempts * math.log(base) >= math.log(max(cap, 1)):
        return float(cap)
    return min(float(base ** attempts), float(cap))


def failure_rule(job: Job, outcome: Outcome, settings: dict, now: float) -> tuple[str, int, float]:
    """(state, attempts, next_run_at) after a run: completed, failed with backoff, or dead.

    max_retries counts runs: at least one run always happens, so 0 and 1 both mean "no retry".
    """
    if outcome.exit_code == 0 and outcome.error is None:
        return COMPLETED, job.attempts, job.next_run_at
    attempts = job.attempts + 1
    if attempts >= max(job.max_retries, 1):
        return DEAD, attempts, job.next_run_at
    delay = backoff_delay(attempts, settings["backoff_base"], settings["backoff_max"])
    return FAILED, attempts, now + delay


def recovery_rule(lost_count: int) -> tuple[str, str | None]:
    """State for a job whose worker was lost for the `lost_count`-th time."""
    if lost_count >= LOST_WORKER_CAP:
        return DEAD, f"worker lost {lost_count} times (the job may be killing its worker)"
    return PENDING, None


def lease_expired(last_change_mono: float, now_mono: float, stale_timeout_s: float) -> bool:
    """True if a heartbeat counter has not moved for stale_timeout_s of *our* monotonic clock.

    We never compare another host's wall clock with ours: clock steps and skew cannot kill a
    live worker, only a heartbeat that stops changing can.
    """
    return now_mono - last_change_mono > stale_timeout_s


def validate_job(obj: object, defaults: dict, cwd: str) -> dict:
    """Check an enqueue JSON object field by field; returns a complete spec or raises UsageError."""
    if not isinstance(obj, dict):
        raise UsageError("job must be a JSON object")
    unknown = sorted(set(obj) - {"id", "command", "max_retries", "timeout", "cwd", "env"})
    if unknown:
        raise UsageError(f"unknown field {unknown[0]!r} (fields: command, id, max_retries, timeout, cwd, env)")
    if "command" not in obj:
        raise UsageError("field 'command' is required")
    return {
        "command": _valid_command(obj["command"]),
        "id": _valid_id(obj["id"]) if "id" in obj else os.urandom(8).hex(),
        "max_retries": _valid_int(obj.get("max_retries", defaults["max_retries"]), "max_retries"),
        "timeout": _valid_seconds(obj.get("timeout", defaults["job_timeout"]), "timeout"),
        "cwd": _valid_cwd(obj.get("cwd", cwd)),
        "env": _valid_env(obj.get("env", {})),
    }


def _valid_text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"field {field!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"field {field!r} is not valid Unicode (lone surrogate)") from None
    if "\0" in value:
        raise UsageError(f"field {field!r} must not contain NUL")
    return value


def _valid_command(value: object) -> str:
    command = _valid_text(value, "command")
    if not command.strip():
        raise UsageError("field 'command' must not be blank")
    if len(command.encode("utf-8")) > MAX_COMMAND_BYTES:
        raise UsageError(f"field 'command' is longer than {MAX_COMMAND_BYTES} bytes")
    return command


def _valid_id(value: object) -> str:
    job_id = _valid_text(value, "id")
    if not job_id or len(job_id) > MAX_ID_CHARS:
        raise UsageError(f"field 'id' must be 1 to {MAX_ID_CHARS} characters")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 or c in "\u2028\u2029" for c in job_id):
        raise UsageError("field 'id' must not contain control characters or line separators")
    return job_id


def _valid_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise UsageError(f"field {field!r} must be an integer from 0 to {MAX_RETRIES_LIMIT}")
    return value


def _valid_seconds(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise UsageError(f"field {field!r} must be a number of seconds from 0 to {MAX_SECONDS}")
    return float(value)


def _valid_cwd(value: object) -> str:
    cwd = _valid_text(value, "cwd")
    if not os.path.isabs(cwd):
        raise UsageError("field 'cwd' must be an absolute path")
    return cwd


def _valid_env(value: object) -> dict:
    if not isinstance(value, dict):
        raise UsageError("field 'env' must be an object of strings")
    for key, val in value.items():
        _valid_text(key, "env")
        _valid_text(val, f"env.{key}")
        if not key or "=" in key:
            raise UsageError(f"env name {key!r} must be non-empty and without '='")
    return value


def parse_json(text: str) -> object:
    """json.loads that rejects NaN/Infinity, out-of-range numbers and duplicate keys."""
    def no_constant(name):
        raise UsageError(f"invalid JSON: {name} is not allowed")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise UsageError(f"invalid JSON: duplicate key {dup!r}")
        return dict(pairs)

    def finite(text):
        value = float(text)
        if not math.isfinite(value):
            raise UsageError(f"invalid JSON: number {text} is out of range")
        return value
    try:
        return json.loads(text, parse_constant=no_constant, object_pairs_hook=no_duplicates, parse_float=finite)
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        raise UsageError(f"invalid JSON: {e}") from None
    except RecursionError:
        raise UsageError("invalid JSON: nested too deeply") from None


# ==== Execution ==================================================================================

def run_command(job: Job, env_extra: dict, abort) -> Outcome:
    """Run a job's command in its own session; keep the last OUTPUT_TAIL_BYTES of its output.

    `abort()` is polled while the command runs; when it returns a reason the process group is
    killed and the outcome is marked interrupted.
    """
    import subprocess
    started = time.monotonic()
    env = {**os.environ, **job.env, **env_extra}
    try:
        # start_new_session: the job gets its own process group, so the terminal's Ctrl+C meant
        # for the worker never reaches it, and killpg() reaches all of its children.
        proc = subprocess.Popen(["/bin/sh", "-c", job.command], cwd=job.cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        error = f"cannot start: {e.strerror}: {job.cwd}" if isinstance(e, FileNotFoundError) else f"cannot start: {e}"
        return Outcome(None, error, "", time.monotonic() - started)
    with proc:
        tail, reason = _collect(proc, job.timeout, started, abort)
    if reason:  # the group is dead; also catch children that left it with setsid
        kill_run_orphans(env_extra.get("QUEUECTL_RUN", ""))
    duration = time.monotonic() - started
    return _outcome(proc.returncode, reason, bytes(tail).decode("utf-8", "replace"), duration, job.timeout)


def _collect(proc, timeout_s: float, started: float, abort) -> tuple[bytearray, str | None]:
    """Read output until EOF and exit, a timeout or an abort; returns (tail, reason it was cut)."""
    import select
    poller = select.poll()
    fd = proc.stdout.fileno()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    tail, eof = bytearray(), False
    while True:
        reason = "timeout" if timeout_s and time.monotonic() - started > timeout_s else abort()
        if reason:
            _kill_group(proc.pid)
            proc.wait()
            return tail, reason
        if proc.poll() is not None:
            # The shell exited. Take what is buffered, but do not wait for EOF: a background
            # child (`cmd &`) may hold the pipe open for as long as it likes.
            while not eof and poller.poll(0) and len(tail) < 64 * OUTPUT_TAIL_BYTES:
                eof = not _read_into(fd, tail)
            return tail, None
        if eof:
            _wait_a_little(proc)  # output closed, shell still running
        elif poller.poll(250):
            eof = not _read_into(fd, tail)


def _read_into(fd: int, tail: bytearray) -> int:
    """Append one read to the tail, keeping only its last OUTPUT_TAIL_BYTES; returns bytes read."""
    chunk = os.read(fd, 65536)
    tail += chunk
    del tail[:-OUTPUT_TAIL_BYTES]
    return len(chunk)


def _wait_a_little(proc) -> None:
    """The shell closed its output but has not exited: wait in short steps so aborts stay responsive."""
    import subprocess
    try:
        proc.wait(0.25)
    except subprocess.TimeoutExpired:
        pass


def _kill_group(pgid: int) -> None:
    import signal
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _outcome(code: int, reason: str | None, output: str, duration: float, timeout_s: float) -> Outcome:
    """Turn a return code and an interruption reason into an Outcome with a clear error."""
    import signal
    if reason == "timeout":
        return Outcome(None, f"timed out after {timeout_s:g}s", output, duration)
    if reason:
        return Outcome(None, f"interrupted: {reason}", output, duration, interrupted=True)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return Outcome(128 - code, f"killed by signal {name}", output, duration)
    if code == 0:
        return Outcome(0, None, output, duration)
    return Outcome(code, f"exit code {code}", output, duration)


# ==== Process identity ===========================================================================
# A worker on the same boot and PID namespace as us can be checked directly through /proc; any
# other worker is judged by its heartbeat lease only.

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def proc_start_time(pid: int) -> str | None:
    """Start time of a live process (clock ticks since boot) or None if gone or a zombie."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is the state (field 3); a zombie has exited even if nobody reaped it
    return None if fields[0] in ("Z", "X") else fields[19]


def host_identity() -> dict:
    """Who this process is, for other workers to decide whether it is still alive."""
    ns = None
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": proc_start_time(os.getpid()),
            "boot_id": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": ns}


def same_namespace(row: WorkerRow, me: dict) -> bool:
    """True if the worker ran on this boot in this PID namespace, so its PID means the same here."""
    return bool(me["boot_id"] and me["pid_ns"]) and (row.boot_id, row.pid_ns, row.host) == (
        me["boot_id"], me["pid_ns"], me["host"])


def process_gone(pid: int, start: str | None) -> bool:
    """True if `pid` is gone, a zombie, or now a different process (start time differs)."""
    return proc_start_time(pid) != start


def kill_run_orphans(token: str) -> int:
    """SIGKILL every process whose environment carries this run's token; returns how many.

    Each run's processes inherit QUEUECTL_RUN=token, so this finds the orphaned shell and its
    children exactly, without trusting a PID that may have been recycled. Repeated until a scan
    finds none, because a process may fork while we kill. (A job that clears its environment
    escapes this: a documented limit.)
    """
    import signal
    if not token:
        return 0
    needle = f"QUEUECTL_RUN={token}\0".encode()
    killed: set[int] = set()
    for _ in range(20):
        # A process already sent SIGKILL may linger a moment (or as an unreaped zombie): only
        # new matches, such as a child forked during the last pass, need another pass.
        found = [pid for pid in _pids() if pid not in killed and needle in (_environ(pid) or b"")]
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(found)
        if not found:
            break
    return len(killed)


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return []


def _environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read() + b"\0"
    except OSError:
        return None


# ==== Workers ====================================================================================

def run_token(job: Job, worker_id: str) -> str:
    """A string unique to one run of one job, placed in its environment to find orphans later."""
    return f"{worker_id}/{job.run_count}/{job.id}"


class Worker:
    """One runner thread's logic: claim a due job, run it, record what happened."""

    def __init__(self, store: Store, worker_id: str, abort):
        self.store = store
        self.worker_id = worker_id
        self.abort = abort  # callable -> reason to kill the running job, or None
        self.runner = run_command  # injectable for tests and simulation
        self.current: Job | None = None

    def run_once(self, now: float | None = None) -> bool:
        """Claim and run at most one job; True if one was run."""
        job = self.store.claim(self.worker_id, time.time() if now is None else now)
        if job is None:
            return False
        self.current = job
        try:
            self._run(job, now)
        finally:
            self.current = None
        return True

    def _run(self, job: Job, now: float | None) -> None:
        log.info("job %s claimed (attempt %d): %s", job.id, job.attempts + 1, _short(job.command))
        env = {"QUEUECTL_JOB_ID": job.id, "QUEUECTL_ATTEMPT": str(job.attempts + 1),
               "QUEUECTL_RUN": run_token(job, self.worker_id)}
        outcome = self.runner(job, env, self.abort)
        self._record(job, outcome, now)

    def _record(self, job: Job, outcome: Outcome, now: float | None) -> None:
        """Write the outcome, retrying until the database takes it: a finished run is never dropped."""
        while True:
            try:
                return self._write_outcome(job, outcome, time.time() if now is None else now)
            except (Busy, sqlite3.OperationalError) as e:
                log.warning("job %s: cannot record result yet (%s); retrying", job.id, e)
                time.sleep(0.5)

    def _write_outcome(self, job: Job, outcome: Outcome, now: float) -> None:
        if outcome.interrupted:
            put_back = self.store.release(job, self.worker_id, outcome, now)
            log.info("job %s %s (%s)", job.id, "put back to pending" if put_back else "no longer ours", outcome.error)
            return
        settings = self.store.config_all()
        _log_result(job, self.store.finish(job, self.worker_id, outcome, settings, now), outcome)


def _log_result(job: Job, after: Job | None, outcome: Outcome) -> None:
    if after is None:
        log.warning("job %s: result discarded, this worker no longer owns it", job.id)
    elif after.state == COMPLETED:
        log.info("job %s completed in %.2fs", job.id, outcome.duration_s)
    elif after.state == FAILED:
        log.info("job %s failed (%s); retry %d in %.0fs", job.id, outcome.error, after.attempts + 1,
                 max(0.0, after.next_run_at - time.time()))
    else:
        log.info("job %s dead after %d attempts: %s", job.id, after.attempts, outcome.error)


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


class Sweeper:
    """Finds workers that died and makes their jobs runnable again, killing their leftovers first."""

    def __init__(self, store: Store, me: dict, worker_id: str):
        self.store = store
        self.me = me
        self.worker_id = worker_id
        self.seen: dict[str, tuple[int, float]] = {}  # worker id -> (beat, when it last changed, monotonic)

    def sweep(self, now: float, now_mono: float | None = None) -> int:
        """One pass; returns how many jobs were recovered."""
        now_mono = time.monotonic() if now_mono is None else now_mono
        stale_s = self.store.config_get("stale_timeout")
        recovered = 0
        for row in self.store.workers():
            if row.id != self.worker_id and self.is_dead(row, now_mono, stale_s):
                recovered += self._recover_worker(row, now)
        for job_id, run_no, lost, owner in self.store.orphan_jobs():
            recovered += self._recover_job(job_id, owner, run_no, lost, now, None)
        return recovered

    def is_dead(self, row: WorkerRow, now_mono: float, stale_s: float) -> bool:
        """Same namespace: its PID tells at once. Otherwise: its heartbeat stopped moving for stale_s."""
        if same_namespace(row, self.me):
            return process_gone(row.pid, row.proc_start)
        beat, since = self.seen.get(row.id, (None, now_mono))
        if beat != row.beat:
            self.seen[row.id] = (row.beat, now_mono)
            return False
        return lease_expired(since, now_mono, stale_s)

    def _recover_worker(self, row: WorkerRow, now: float) -> int:
        local = same_namespace(row, self.me)
        count = sum(self._recover_job(job_id, row.id, run_no, lost, now, local)
                    for job_id, run_no, lost in self.store.jobs_of(row.id))
        self.store.drop_worker(row.id)
        self.seen.pop(row.id, None)
        return count

    def _recover_job(self, job_id: str, owner: str, run_no: int, lost: int, now: float, local: bool | None) -> int:
        # Kill the orphan first, then requeue: the other order would let a new run overlap the old.
        if local is not False:
            kill_run_orphans(f"{owner}/{run_no}/{job_id}")
        state = self.store.recover(job_id, owner, run_no, lost, now)
        if state:
            log.warning("job %s recovered from lost worker %s -> %s", job_id, owner, state)
        return 1 if state else 0


# ==== Signals and supervisor =====================================================================

class Supervisor:
    """One worker process: registers, runs N Worker threads, heartbeats, sweeps, polls, stops."""

    def __init__(self, path: str, count: int, burst: bool):
        import threading
        self.path = path
        self.count = count
        self.burst = burst
        self.store = Store(path, durable=False, busy_deadline_s=30.0)
        self.me = host_identity()
        self.worker_id = f"{self.me['host']}:{self.me['pid']}:{os.urandom(3).hex()}"
        self.stopping = threading.Event()  # claim nothing more
        self.hard = threading.Event()  # kill running jobs and put them back
        self.lost = threading.Event()  # our registration vanished: another worker took our jobs
        self.wake = threading.Condition()
        self.signals = 0
        self.signalled = threading.Event()
        self.workers: list[Worker] = []

    # -- signals: handlers only count and set an event; the loop does the rest ------------------

    def install_signals(self) -> None:
        """SIGINT/SIGTERM: first = graceful stop, second = hard stop."""
        import signal
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        self.signalled.set()

    def abort_reason(self) -> str | None:
        """Why a running job must be killed now, if it must."""
        if self.hard.is_set():
            return "worker hard stop"
        if self.lost.is_set():
            return "worker lost its registration"
        return None

    # -- main loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; returns the exit code."""
        import threading
        self.store.register(self.worker_id, self.me, self.count, time.time())
        log.info("worker started: %s, %d thread(s), db %s", self.worker_id, self.count, self.path)
        self.sweeper = Sweeper(self.store, self.me, self.worker_id)
        self.sweeper.sweep(time.time())  # recover what a previous crash or boot left, before claiming
        threads = [threading.Thread(target=self._thread_main, args=(i,), daemon=True) for i in range(self.count)]
        for t in threads:
            t.start()
        self._loop(threads)
        for t in threads:
            t.join()
        self.store.deregister(self.worker_id)
        code = EXIT_INTERRUPTED if self.hard.is_set() else EXIT_OK
        log.info("worker exited (%d)", code)
        return code

    def _loop(self, threads: list) -> None:
        next_beat = next_sweep = 0.0
        while any(t.is_alive() for t in threads):
            self.signalled.wait(POLL_INTERVAL_S)
            self._handle_signals()
            mono = time.monotonic()
            try:
                if mono >= next_beat:
                    next_beat = mono + self._heartbeat()
                if mono >= next_sweep:
                    next_sweep = mono + SWEEP_INTERVAL_S
                    self.sweeper.sweep(time.time())
                self._poll()
            except (QueueError, sqlite3.Error) as e:  # a busy or full database must not kill the worker
                log.warning("housekeeping failed: %s; retrying", e)

    def _handle_signals(self) -> None:
        if not self.signalled.is_set():
            return
        self.signalled.clear()
        if self.signals >= 2 and not self.hard.is_set():
            log.warning("second signal: killing running jobs and putting them back")
            self.hard.set()
            self._stop("signal")
        elif self.signals == 1:
            self._stop("signal")

    def _stop(self, why: str) -> None:
        if not self.stopping.is_set():
            running = sum(1 for w in self.workers if w.current)
            log.info("stopping (%s): claiming nothing more, waiting for %d running job(s)", why, running)
            self.stopping.set()
        with self.wake:
            self.wake.notify_all()

    def _heartbeat(self) -> float:
        """Beat, obey a stop request; returns seconds to the next beat."""
        stop = self.store.heartbeat(self.worker_id, time.time())
        if stop is None:
            self._on_lost_registration()
        elif stop:
            self._stop("worker stop")
        return max(0.2, min(2.0, self.store.config_get("stale_timeout") / 5))

    def _on_lost_registration(self) -> None:
        # Another worker declared us dead (we were paused past the lease) and requeued our jobs:
        # kill our runs at once so they cannot overlap the new ones, then register again.
        log.error("this worker was presumed dead by another; killing its running jobs and re-registering")
        self.lost.set()
        while any(w.current for w in self.workers):
            time.sleep(0.05)
        self.lost.clear()
        self.store.register(self.worker_id, self.me, self.count, time.time())

    def _poll(self) -> None:
        """Wake idle threads when a job is due; in burst mode, stop when the queue is drained."""
        now = time.time()
        due = self.store.next_due_at()
        if due is not None and due <= now:
            with self.wake:
                self.wake.notify_all()
        elif self.burst and not self.stopping.is_set() and not any(w.current for w in self.workers) \
                and self.store.burst_done(now):
            self._stop("burst: queue drained")

    # -- runner threads --------------------------------------------------------------------------

    def _thread_main(self, index: int) -> None:
        store = Store(self.path, durable=False, busy_deadline_s=30.0)
        worker = Worker(store, self.worker_id, self.abort_reason)
        self.workers.append(worker)
        while not self.stopping.is_set():
            try:
                ran = worker.run_once()
            except (QueueError, sqlite3.Error) as e:  # busy or disk full: wait and try again
                log.warning("claim failed: %s", e)
                ran = False
            if not ran:
                with self.wake:
                    self.wake.wait(1.0)
        store.close()


# ==== CLI ========================================================================================

class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> Parser:
    """The whole command line."""
    p = Parser(prog="queuectl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"queuectl {__version__}")
    p.add_argument("--db", help="database file (default: $QUEUECTL_DB or ./queuectl.db)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser("enqueue", help="add a job")
    e.add_argument("job", metavar="JSON", help='job object, e.g. \'{"command": "echo hi"}\'')
    e.add_argument("--json", action="store_true", help="print the job object")
    e.set_defaults(func=cmd_enqueue)

    w = sub.add_parser("worker", help="start or stop workers").add_subparsers(dest="action", required=True)
    ws = w.add_parser("start", help="run a worker in the foreground")
    ws.add_argument("--count", type=int, default=1, help="threads, each running one job at a time")
    ws.add_argument("--burst", action="store_true", help="exit once the due work is drained")
    ws.set_defaults(func=cmd_worker_start)
    wt = w.add_parser("stop", help="ask every running worker to stop gracefully")
    wt.add_argument("--wait", action="store_true", help="return once they have exited")
    wt.add_argument("--timeout", type=float, default=None, help="with --wait: give up after S seconds")
    wt.set_defaults(func=cmd_worker_stop)

    s = sub.add_parser("status", help="job counts and live workers")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    ls = sub.add_parser("list", help="list jobs, oldest first")
    ls.add_argument("--state", help=f"one of {', '.join(STATES)}")
    ls.add_argument("--limit", type=int, default=None, help="only the N most recently created")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="one job in full")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)

    lg = sub.add_parser("logs", help="output of the job's latest run")
    lg.add_argument("id")
    lg.set_defaults(func=cmd_logs)

    d = sub.add_parser("dlq", help="the dead-letter queue").add_subparsers(dest="action", required=True)
    dl = d.add_parser("list", help="dead jobs")
    dl.add_argument("--json", action="store_true")
    dl.set_defaults(func=cmd_dlq_list)
    dr = d.add_parser("retry", help="move dead jobs back to pending")
    dr.add_argument("ids", nargs="+", metavar="ID")
    dr.set_defaults(func=cmd_dlq_retry)

    c = sub.add_parser("config", help="settings").add_subparsers(dest="action", required=True)
    cs = c.add_parser("set")
    cs.add_argument("key")
    cs.add_argument("value")
    cs.set_defaults(func=cmd_config_set)
    cg = c.add_parser("get")
    cg.add_argument("key")
    cg.set_defaults(func=cmd_config_get)
    cl = c.add_parser("list")
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=cmd_config_list)
    return p


def open_store(args) -> Store:
    """The Store named by --db, $QUEUECTL_DB or ./queuectl.db."""
    path = args.db or os.environ.get("QUEUECTL_DB") or "queuectl.db"
    _valid_text(path, "--db")
    return Store(path)


def config_key(name: str) -> str:
    """Normalise a config key (hyphens or underscores); UsageError listing the valid keys."""
    key = name.replace("-", "_")
    if key not in CONFIG:
        raise UsageError(f"unknown config key {name!r} (valid: {', '.join(k.replace('_', '-') for k in CONFIG)})")
    return key


def emit_json(value) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def cmd_enqueue(args, store: Store) -> None:
    spec = validate_job(parse_json(args.job), store.config_all(), os.getcwd())
    job = store.enqueue(spec, time.time())
    emit_json(job.to_dict()) if args.json else print(job.id)


def cmd_worker_start(args, store: Store) -> int:
    if not 1 <= args.count <= 256:
        raise UsageError("--count must be from 1 to 256")
    store.close()
    supervisor = Supervisor(store.path, args.count, args.burst)
    supervisor.install_signals()
    return supervisor.run()


def cmd_worker_stop(args, store: Store) -> int:
    asked = {w.id for w in store.workers()}
    n = store.request_stop()
    print(f"asked {n} worker{'s' if n != 1 else ''} to stop")
    if not args.wait:
        return EXIT_OK
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while asked & {w.id for w in live_workers(store)}:
        if deadline is not None and time.monotonic() > deadline:
            raise QueueError("timed out waiting for workers to exit")
        time.sleep(0.1)
    return EXIT_OK


def live_workers(store: Store) -> list[WorkerRow]:
    """Workers that look alive: same namespace by PID, others by a recent heartbeat (wall clock, display only)."""
    me, now, stale = host_identity(), time.time(), store.config_get("stale_timeout")
    return [w for w in store.workers()
            if (not process_gone(w.pid, w.proc_start) if same_namespace(w, me) else now - w.heartbeat_at <= stale)]


def cmd_status(args, store: Store) -> None:
    counts, active = store.counts(), len(live_workers(store))
    if args.json:
        return emit_json({"jobs": counts, "active_workers": active})
    for state in STATES:
        print(f"{state:<12}{counts[state]:>8}")
    print(f"{'workers':<12}{active:>8}")


def print_jobs(jobs: list[Job], as_json: bool) -> None:
    if as_json:
        return emit_json([j.to_dict() for j in jobs])
    print(f"{'ID':<20} {'STATE':<11} {'ATTEMPTS':>8}  {'UPDATED':<24} COMMAND")
    for j in jobs:
        print(f"{j.id:<20} {j.state:<11} {j.attempts:>4}/{j.max_retries:<3}  {iso(j.updated_at):<24} {_short(j.command)}")


def cmd_list(args, store: Store) -> None:
    if args.state is not None and args.state not in STATES:
        raise UsageError(f"unknown state {args.state!r} (valid: {', '.join(STATES)})")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    print_jobs(store.list_jobs(args.state, -1 if args.limit is None else args.limit), args.json)


def cmd_show(args, store: Store) -> None:
    job = store.get(args.id)
    output = store.last_output(args.id)
    if args.json:
        return emit_json({**job.to_dict(), "output": output})
    for key, value in job.to_dict().items():
        print(f"{key + ':':<13} {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}")
    print("output:" + ("" if output else " (none)"))
    if output:
        print(output, end="" if output.endswith("\n") else "\n")


def cmd_logs(args, store: Store) -> None:
    output = store.last_output(args.id)
    if output:
        sys.stdout.write(output)


def cmd_dlq_list(args, store: Store) -> None:
    print_jobs(store.list_jobs(DEAD), args.json)


def cmd_dlq_retry(args, store: Store) -> None:
    for job_id in args.ids:
        _valid_text(job_id, "id")
    store.retry_dead(list(dict.fromkeys(args.ids)), time.time())
    for job_id in dict.fromkeys(args.ids):
        print(job_id)


def cmd_config_set(args, store: Store) -> None:
    key = config_key(args.key)
    try:
        value = CONFIG[key][1](args.value)
    except UsageError as e:
        raise UsageError(f"config {args.key}: {e}") from None
    store.config_set(key, value)


def cmd_config_get(args, store: Store) -> None:
    print(store.config_get(config_key(args.key)))


def cmd_config_list(args, store: Store) -> None:
    values = {k.replace("_", "-"): v for k, v in store.config_all().items()}
    if args.json:
        return emit_json(values)
    for key, value in values.items():
        print(f"{key} = {value}")


def main(argv: list[str] | None = None) -> int:
    """Parse, run one command, map errors to `queuectl: error: …` and an exit code."""
    logging.basicConfig(format="%(asctime)s queuectl[%(process)d]: %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else EXIT_OK
    except QueueError as e:
        return _fail(e)
    store = None
    try:
        store = open_store(args)
        return args.func(args, store) or EXIT_OK
    except QueueError as e:
        return _fail(e)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except sqlite3.DatabaseError as e:
        return _fail(QueueError(f"database error: {e}"))
    except BrokenPipeError:  # `queuectl list | head`: the reader left; not an error worth a line
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return EXIT_OK
    except OSError as e:
        return _fail(QueueError(f"{e.strerror or e}: {e.filename or ''}".rstrip(": ")))
    finally:
        if store is not None:
            store.close()


def _fail(error: QueueError) -> int:
    print(f"queuectl: error: {error}", file=sys.stderr)
    return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
