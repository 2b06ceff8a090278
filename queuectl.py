#!/bin/sh
# These lines down to the closing quotes are both sh and Python. Run as a program (a copied or
# installed file), sh execs python3 on a short -c that reads this file and runs the loader between
# the two `#@` lines (its text kept off the command line, which ps, top and systemd show as
# `python3 -P -c … PATH ARGS`). The loader runs this file from bytecode cached in
# $XDG_CACHE_HOME/queuectl (default ~/.cache/queuectl): Python caches the bytecode of imported modules
# only, never of the script it runs, and compiling this file costs more than the rest of a command's
# start-up. The cache is checked against a hash of the file's content, so an edited file never runs
# old code, and it is used only if no one but this user could have written it; else (or without a
# usable cache folder) it just compiles. `python3 queuectl.py` and `python3 -m queuectl` read these
# lines as one string assignment. exec (not a child process): the worker gets its signals and exit
# code as it would without the launcher.
_LAUNCHER=''''
exec python3 -P -c 'import sys;source=open(sys.argv[1],"rb").read();exec(source.split(b"\n#@\n")[1])' "$0" "$@"
#@
# queuectl: run this file from cached bytecode (see above); `source` is its bytes, read by the -c
import marshal, os, stat, sys, types
from importlib.util import MAGIC_NUMBER, source_hash
path, real = sys.argv[1], os.path.realpath(sys.argv[1])
sys.path.insert(0, os.path.dirname(real))  # as for a script: its own folder (-P left out the current one)
del sys.argv[0]
key = MAGIC_NUMBER + (3).to_bytes(4, "little") + source_hash(source)
xdg, home = os.environ.get("XDG_CACHE_HOME", ""), os.environ.get("HOME", os.path.expanduser("~"))
folder = os.path.join(xdg if os.path.isabs(xdg) else os.path.join(home, ".cache"), "queuectl")
name = f"queuectl-{source_hash(os.fsencode(real)).hex()}.{sys.implementation.cache_tag}-O{sys.flags.optimize}.pyc"
def own(fd):  # owned by this user, writable by nobody else: no one else can have planted what it holds
    st = os.fstat(fd)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022
at = code = None
try:
    if os.path.isabs(folder):  # else an empty or relative HOME: no cache
        if not sys.dont_write_bytecode:
            os.makedirs(folder, 0o700, exist_ok=True)
        at = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        if not own(at):  # e.g. root run with the HOME of another user (sudo -E): neither read nor write it
            os.close(at)
            at = None
    if at is not None:  # never through a link, never waiting on a FIFO, never reading a device or a huge file
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=at)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 24 and own(fd):
                data = f.read()
                code = marshal.loads(data[16:]) if data[:16] == key else None
except Exception:
    pass  # missing, unreadable, damaged or not safe to trust: compile
if code is None:
    code = compile(source, real, "exec", dont_inherit=True)
    if at is not None and not sys.dont_write_bytecode:
        temp = f"{name}.{os.getpid()}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=at)
            with open(fd, "wb") as f:
                f.write(key + marshal.dumps(code))
            os.replace(temp, name, src_dir_fd=at, dst_dir_fd=at)
        except OSError:
            try:
                os.unlink(temp, dir_fd=at)
            except OSError:
                pass
if at is not None:
    os.close(at)
main = types.ModuleType("__main__")
main.__file__ = path
sys.modules["__main__"] = main
exec(code, main.__dict__)
#@
'''
__doc__ = """queuectl: a persistent background job queue for shell commands, in one SQLite file or PostgreSQL.

Enqueue jobs as JSON or command lines, run foreground workers that claim and run them, retry failures with
exponential backoff, and keep jobs that exhaust their retries in a dead-letter queue (DLQ).
A worker killed with SIGKILL loses nothing: another worker recovers its jobs.

commands:
  enqueue JSON | -        add a job, e.g. '{"id": "a", "command": "echo hi"}', or a batch from stdin
  add [OPTIONS] -- CMD    add a job from a command line, e.g. add --queue q --delay 15m -- make test
  run [OPTIONS] -- CMD    add a job and wait for it: its output, retries and exit code, as if run here
  worker start|stop|list  run workers in the foreground / ask every worker to stop / list them
  status, list, show, logs, stats, metrics, wait
  cancel, delete, purge   operate on jobs
  pause, resume           stop and restart claims from queues
  limit, queues           per-queue concurrency limits; every queue with its counts, pause and limit
  dlq list|retry          the dead-letter queue
  schedule add|update|list|next|pause|resume|remove   recurring jobs: cron expressions or fixed intervals
  dashboard               a live web view of the queue and a JSON API (http://127.0.0.1:8321)
  config set|get|list     max-retries, backoff-base, backoff-max, stale-timeout, job-timeout, retention,
                          output-limit, kill-grace, on-dead
  completion bash|zsh|fish  print a shell completion script (README: Shell completion)
  help [COMMAND]          a command's options and arguments (as COMMAND --help)

example:
  queuectl add -- echo hello        # add a job; prints its id
  queuectl worker start --burst     # run the jobs that are due, then exit
  queuectl list                     # every job and its state
"""

# ---- A map of this file ----------------------------------------------------------------------
# Sections, in order (`grep -n '^# ====' queuectl.py` lists them; each uses only those above it):
# Constants (states, exit codes, limits) · Errors (QueueError and its exit codes) · Model (Job, Schedule,
# WorkerRow, time and text helpers) · Rules and validation (pure: backoff, failure_rule, lease_expired,
# validate_job, parse_duration, the CONFIG table) · Schedules (cron and interval rules) · Process identity
# (/proc: host_identity, looks_alive) · Wake-ups (WakeSender: a same-host datagram after a commit) ·
# Storage (the schema, every SQL statement beside the class that runs it: Store, SqliteStore,
# PostgresStore) · Process control (kill_run, Watchdog) · Execution (run_command and the process group it
# kills) · Workers (Runner, Sweeper, ScheduleFirer) · The worker process (Worker: one `worker start`, its
# signals, registration, housekeeping and runner threads) · Dashboard (HTTP, metrics_text) · CLI
# (build_parser, cmd_*, `run`'s ForegroundRun, shell Completion, main).
#
# The path of a job:
#   enqueue   cmd_enqueue / cmd_add -> validate_job -> Store.enqueue (one transaction; synced before the id prints)
#   claim     Worker._thread_main -> Runner.run_once -> Store.claim (an atomic UPDATE ... RETURNING that
#             also opens the run's record; PostgreSQL: FOR UPDATE SKIP LOCKED)
#   run       Runner._run -> run_command -> _spawn (own process group) -> _Capture.collect (output tail,
#             timeout, abort(): cancel, hard stop, cut-off) -> _Capture.stop (SIGTERM, grace, SIGKILL)
#   record    Runner._record -> Store.finish / finish_and_claim (failure_rule: retry with backoff, or dead)
#   recover   Worker._housekeeping -> Sweeper.sweep: a worker presumed dead (same host: its PID; else
#             lease_expired) is dropped, kill_run ends its runs' processes, then Store.interrupt requeues
#   guard     Worker._guard: what must happen on time whatever the database does (cut-off line, hard stop)
#   die       any statement that makes a job dead fires the trigger jobs_dead (migration 6): its on_dead
#             notification job, in the same transaction, which Runner._run_command starts with the dead run's output

# Heavy modules (subprocess, threading, signal, select) are imported only by the worker code
# that needs them: every command pays for what it imports, and `enqueue` should start fast.
import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from datetime import date, datetime, timezone

# A new schema version (SCHEMA_VERSION) always comes with a new __version__: a worker's version, which
# `worker list` shows, then tells which schema it knows.
__version__ = "1.2.0"

class _Log:
    """logging.getLogger("queuectl"), imported on first use: only workers log, and the import
    costs every other command start-up time."""
    # `worker start --quiet`: the routine lines of each job (claimed, completed) are not written.
    # Those call sites test this first, so a quiet worker pays neither for the line nor for its arguments.
    quiet = False
    lines: "RoutineLines | None" = None  # the text format's way around logging for those lines (see routine)

    def __getattr__(self, name: str):
        import logging
        method = getattr(logging.getLogger("queuectl"), name)
        setattr(self, name, method)  # later calls find it at once (the logger object never changes)
        return method

    def routine(self, message: str, args: tuple, extra: "Callable[[], dict]") -> None:
        """A job's routine line (claimed, completed) at INFO, `extra()` its event. A worker's text format
        writes it through RoutineLines: the same bytes, without logging's record, on every job's path."""
        if self.lines is None or not self.lines.alone():
            self.info(message, *args, extra=extra())
        else:
            self.lines.write(message % args)


log = _Log()


def event(name: str, **fields) -> dict:
    """The `extra=` of a log call: the event's name and fields, which `--log-format json` writes out."""
    return {"event": name, "fields": fields}


# ==== Constants ==================================================================================

PENDING, PROCESSING, COMPLETED, FAILED, DEAD = "pending", "processing", "completed", "failed", "dead"
STATES = (PENDING, PROCESSING, COMPLETED, FAILED, DEAD)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130
# `run`'s own exit codes beside its job's (see cmd_run), as timeout(1) answers: its job's timeout killed
# it; the job ended without an exit code of its own (canceled, lost too often, never started, a dependency died)
EXIT_TIMED_OUT, EXIT_NOT_RUN = 124, 125
TIMED_OUT = "timed out"  # how the error of a run its timeout killed begins

SCHEMA_VERSION = 6
VERSIONED_WORKERS = 5  # the first schema whose worker rows record their queuectl version
UNRECORDED_VERSION = "1.0.0"  # what every queuectl before that schema called itself
APPLICATION_ID = 0x51435431  # "QCT1": marks a SQLite file as a queuectl database

MAX_COMMAND_BYTES = 131_071  # Linux MAX_ARG_STRLEN (one argv string) less its terminating NUL
# A job's env in all: argv and the environment share one limit of a quarter of the stack's (2 MiB with
# the usual 8 MiB), which the worker's own environment and the command also use.
MAX_ENV_BYTES = 1024 * 1024
MAX_ID_CHARS = 200
COMPLETE_LIMIT = 300  # values a shell completion offers at most: more is no help on a screen
COMPLETE_DEADLINE_S = 2.0  # a Tab that takes longer (a server that stopped answering) ends, offering nothing
COMPLETE_WALK = 1000  # index entries one of its walks reads at most (see SharedSQL.SQL_COMPLETE_DEAD_IDS)
# The ids the trigger of migration 6 gives notification jobs: a job enqueued with one would take a death's.
NOTICE_ID = re.compile(r"@dead-[0-9]+-[0-9]+\Z")
MAX_RETRIES_LIMIT = 1_000_000
MAX_SECONDS = 10 * 365 * 86400  # caps timeouts and delays: keeps every number finite and storable
OUTPUT_TAIL_BYTES = 64 * 1024  # the default of config output-limit
MIN_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT = 1024, 64 * 1024 * 1024
SIZE = re.compile(r"\s*([0-9]+)[ \t]*(KiB|MiB|K|M|k|m|B)?\s*", re.ASCII)  # as DURATION: "１０２４" is no size
SIZE_UNITS = {"B": 1, "K": 1024, "k": 1024, "KiB": 1024, "M": 1024 ** 2, "m": 1024 ** 2, "MiB": 1024 ** 2}
# Messages to a worker's watchdog that wait for room in its pipe, at most (3 a job, up to about 300 bytes
# each with a long job id: a few MB at worst).
WATCHDOG_BACKLOG = 20_000
PR_SET_PDEATHSIG, SIGKILL = 1, 9  # Linux's prctl option, and the signal it asks for (see _die_with_worker)
# A command made only of these words is exec'd without a shell (see direct_argv); the first word
# may not contain '=', which would make it a variable assignment.
PLAIN_COMMAND = re.compile(r"[ \t]*[A-Za-z0-9_./:@%+,-]+(?:[ \t]+[A-Za-z0-9_./:@%+,=-]+)*[ \t]*")
SHELL_WORDS = frozenset(
    "! . : [ [[ { } alias bg break case cd chdir command continue do done echo elif else esac eval exec exit "
    "export false fc fg fi for function getopts hash if in jobs kill local printf pwd read readonly return "
    "select set shift source test then time times trap true type ulimit umask unalias unset until wait "
    "while".split())
MAX_PRIORITY = 1_000_000
MAX_DEPS = 1000
MAX_LIMIT = 1_000_000  # the largest per-queue concurrency limit
MAX_UNIX_TIME = 253_402_300_799  # 9999-12-31T23:59:59Z
DEFAULT_QUEUE = "default"
# Text for a terminal: what a person reads is printed through printable(): a job's command, error,
# output, ids, queue and host names come from whoever enqueued the job or ran the worker, and a raw ESC,
# CR or C1 character in them would let that person clear the reader's screen, recolour it, or forge
# lines of output. C0 and C1 controls, DEL, the line and paragraph separators and the bidirectional
# formatting characters (which reorder what follows them on the line) are shown escaped; other Unicode
# is kept. A job id may contain none of them (see _valid_id): ids are printed as they are, for scripts.
NOT_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"  # DEL, C1, separators, bidi controls
UNSAFE_TEXT = re.compile(rf"[\x00-\x1f{NOT_C0}]")
UNSAFE_IN_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f{NOT_C0}]")  # a job's output keeps its lines and tabs
UNSAFE_IN_JSON = re.compile(rf"[{NOT_C0}]")  # json.dumps escapes C0 itself
NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
QUEUE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Numbers as people type them, one grammar for every number queuectl reads (see parse_number): ASCII
# digits only (int() takes "３" and "1_000", float() "+5", "1e3" and "nan"), blanks around them ignored.
NUMBER = re.compile(r"\s*(-?[0-9]+(?:\.[0-9]+)?)\s*", re.ASCII)
INTEGER = re.compile(r"\s*(-?[0-9]+)\s*", re.ASCII)
DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)([smhdw]?)\s*", re.ASCII)  # a NUMBER, unsigned, and a unit
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PURGE_SLICE = 2000  # jobs that purge and retention delete per transaction: tens of ms of write lock
BATCH_PROGRESS_LINES = 10_000  # `enqueue -` shows its progress line on a terminal past this many lines
WAIT_POLL_S = 0.25  # how often `wait` looks again (and redraws its progress line)
# `wait ID`: how long no live worker may serve a waited job's queue before it says so (a worker
# starting up registers within a second or so)
WAIT_NO_WORKER_S = 3.0
INSERT_SLICE = 10_000  # jobs a batch inserts per executemany, so its progress line can count them stored
BATCH_STREAM_LINES = 10_000  # from this many lines `enqueue -` tries Store.enqueue_streamed (PostgreSQL)
RETENTION_INTERVAL_S = 30.0  # how often workers delete completed jobs older than `retention`
OUTPUT_FLUSH_S = 1.0  # a running job's output reaches the database at most this often (logs --follow)
LOST_WORKER_CAP = 3  # a job whose worker is lost this many times goes to the DLQ
BURST_HORIZON_S = 60.0  # --burst waits for jobs due within this many seconds
# How often an idle worker process checks for due jobs (one poller per process) when no wake-up came:
# a commit that makes a job due wakes the workers (see Wake-ups), and a job due later is waited for
# until its time, so this check finds only what no wake-up could announce (another network namespace).
POLL_INTERVAL_S = 1.0
# The same on PostgreSQL for a worker at rest while its listener is connected (see Worker._regular_check_s): a
# NOTIFY reaches every listener whoever sent it, and one sent while the listener was not connected is made up for
# by a look once it is again.
NOTIFIED_POLL_INTERVAL_S = 5.0
QUICK_JOB_S = 0.01  # a job's exit is watched through a pidfd once it has run this long (see _Capture)
TICK_GAP_S = 0.005  # the shortest gap between two rounds of a worker's main loop (see Worker.tick)
ROUND_SLACK_S = 0.05  # a worker's housekeeping task due this soon runs in the round under way: one wake-up
IDLE_WAIT_S = 60.0  # an idle thread waits for a wake-up; this is only a safety net (the poller wakes it too)
SWEEP_INTERVAL_S = 1.0  # how often each worker process looks for dead workers
# A runner that claimed a job its worker's schedule firing just made waits at most this long for the
# firing's log line before it logs the claim (a log that blocks must not hold the job)
FIRE_LOG_WAIT_S = 1.0
# A run of a worker that none of its runners holds for this long is a claim whose answer was lost
# (see Holdings); handing a claim's answer to its runner takes milliseconds.
STRAY_GRACE_S = 5.0
BUSY_TIMEOUT_S = 1.0  # SQLite's own busy wait per attempt; we retry on top of it
UNBOUNDED = 2**62  # the upper bound of a count with none that matters (list --limit): errors say "0 or more"
CLI_BUSY_DEADLINE_S = 5.0  # a CLI command gives up (exit 1) after retrying this long
CUT_OFF = "worker cut off from the database"  # why a worker killed runs it could no longer hold (lost runs)
CLAIM_ANSWER_LOST = "claim answer lost"  # the error of a run recovered as a stray (see Holdings)
HARD_STOP_S = 5.0  # a hard-stopped worker exits this long after the signal at most, whatever the database does
LATE_EXIT_LINE_S = 0.5  # how long a hard stop's late exit waits for its log lines (see Worker._exit_late)
SOFT_STOPS = ("timeout", "canceled")  # why a run may end in SIGTERM and kill-grace; any other reason kills at once
GRACE_STEP_S = 0.1  # how often a run in its kill-grace is checked for having exited


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


class NoQueue(BadDatabase):
    """A Store that may only read found no queue where it looked (no file, or no schema holding one);
    nothing was created. The CLI then answers from an EmptyStore."""


class UpgradeRefused(BadDatabase):
    """The schema was not upgraded: workers of the older schema are alive (see Store.refuse_older_workers)."""


class OutputLost(QueueError):
    """Standard output could not be written (a full disk, an I/O error); what the command did stays done."""


class _NotItsTurn(Exception):
    """Rolls back a claim that took another job than the one asked for (see Store.claim)."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP ended `run` (see RunSignals): as KeyboardInterrupt, no `except Exception` catches it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ==== Model ======================================================================================

def iso(t: float | None) -> str | None:
    """Unix seconds -> ISO-8601 UTC with milliseconds and a Z, for output."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Record:
    """A row with named fields: a tiny dataclass (importing dataclasses would slow every command's start)."""
    FIELDS: tuple[str, ...] = ()

    def __init__(self, *values, **named):
        self.__dict__.update(zip(self.FIELDS, values), **named)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Job(Record):
    """One job row; `waiting_on` counts dependencies not completed yet (not due while > 0)."""
    FIELDS = ("id", "command", "state", "attempts", "max_retries", "timeout", "cwd", "env", "created_at",
              "updated_at", "next_run_at", "last_error", "exit_code", "worker_id", "run_count", "lost_count",
              "priority", "queue", "waiting_on", "on_dead")
    COLUMNS = ", ".join(FIELDS).replace("timeout", "timeout_s")

    @classmethod
    def from_row(cls, row: tuple) -> "Job":
        """Build a Job from a row selected with Job.COLUMNS (its fields set directly: a claim makes one a job)."""
        job = cls.__new__(cls)
        job.__dict__ = fields = dict(zip(cls.FIELDS, row))
        fields["env"] = {} if fields["env"] == "{}" else json.loads(fields["env"])  # most jobs: no parse per claim
        return job

    def to_dict(self) -> dict:
        """The job as users see it in --json output."""
        d = dict(self.__dict__)
        for key in ("created_at", "updated_at", "next_run_at"):
            d[key] = iso(d[key])
        return d


class Schedule(Record):
    """One schedule row; `last_job_state` is the state of the job its last slot made (None if gone)."""
    FIELDS = ("id", "cron", "every_s", "tz", "overlap", "job", "created_at", "paused", "next_run_at",
              "last_run_at", "last_job_id", "last_job_state")
    COLUMNS = ", ".join(FIELDS[:-1])

    @classmethod
    def from_row(cls, row: tuple) -> "Schedule":
        """Build a Schedule from a row selected with Schedule.COLUMNS and the last job's state."""
        values = list(row)
        values[5], values[7] = json.loads(values[5]), bool(values[7])
        return cls(*values)

    def to_dict(self) -> dict:
        """The schedule as `schedule list --json` shows it (no next slot while paused)."""
        return {"id": self.id, "cron": self.cron, "every": self.every_s, "tz": self.tz, "overlap": self.overlap,
                "paused": self.paused, "next_run_at": None if self.paused else iso(self.next_run_at),
                "last_run_at": iso(self.last_run_at), "last_job_id": self.last_job_id,
                "last_job_state": self.last_job_state, "job": self.job}


class WorkerRow(Record):
    """A registered worker process as stored."""
    FIELDS = ("id", "host", "pid", "proc_start", "boot_id", "pid_ns", "heartbeat_at", "beat", "stop_requested",
              "threads", "started_at", "queues", "version")  # queues: JSON list, or None for every queue


class OlderWorker(Record):
    """A worker registered in a database at an older schema, as a migration reads it (SQL_OLDER_WORKERS)."""
    FIELDS = ("id", "host", "pid", "proc_start", "boot_id", "pid_ns", "heartbeat_at", "version")


class Outcome:
    """What one run of a job's command came to."""

    def __init__(self, exit_code: int | None, error: str | None, output: bytes | str | None, duration_s: float,
                 interrupted: str | None = None):
        self.exit_code = exit_code
        self.error = error
        # the tail of the output; None keeps what was flushed while it ran (a lost run)
        self.output = output.encode() if isinstance(output, str) else output
        self.duration_s = duration_s
        self.interrupted = interrupted  # why the worker interrupted the run ("worker hard stop", "canceled")
        self.stuck: str | None = None  # a process of the run that could not be killed: never rerun it
        self.output_bytes = len(self.output or b"")  # all the run printed, of which `output` is the tail


def output_text(output: bytes | None) -> str | None:
    """Captured output as text (invalid UTF-8 shown as U+FFFD)."""
    return None if output is None else output.decode("utf-8", "replace")


def parse_size(text: str) -> int:
    """'65536', '64K', '64KiB', '1M', '1MiB' -> bytes (K and M are 1024 and 1024²)."""
    match = SIZE.fullmatch(text)
    if not match or len(match[1]) > 12:
        raise UsageError(f"not a size: {text!r} (use bytes, or e.g. 64K, 512KiB, 1M, 16MiB)")
    return int(match[1]) * SIZE_UNITS[match[2] or "B"]


def size_text(n: int) -> str:
    """Bytes for people: '512 B', '64 KiB', '14.2 MiB' (one decimal, none when it is 0; the dashboard's
    bytes() writes the same)."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if round(value, 1) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{round(value, 1):g} {unit}"


# -- paused queues -------------------------------------------------------------------------------
# Store.paused() rows: queue names, or '*' (every queue) with '!name' for each queue resumed alone.

def is_paused(queue: str, paused: list[str]) -> bool:
    """Whether claims skip `queue`, by the rule of the claim statements (the paused checks of SqliteSQL.SQL_NEXT_DUE)."""
    return "!" + queue not in paused and (queue in paused or "*" in paused)


def paused_names(paused: list[str]) -> tuple[list[str], list[str]]:
    """The paused queues (['*'] for every queue) and the queues resumed alone while every queue is paused."""
    return [p for p in paused if p[0] != "!"], [p[1:] for p in paused if p[0] == "!"]


def paused_text(names: list[str], resumed: list[str]) -> str:
    """What status's `paused:` line says of paused_names(): 'all queues', 'all queues except a, b', or the names."""
    if "*" not in names:
        return ", ".join(names)
    return "all queues" + (f" except {', '.join(resumed)}" if resumed else "")


# -- text for a terminal ------------------------------------------------------------------------
# What a person reads is printed through printable() (see UNSAFE_TEXT).


def printable(text: str, lines: bool = False) -> str:
    """`text` safe to print on a terminal: each unsafe character written as a Python string literal
    writes it (`\\x1b`, `\\r`, `\\n`, `\\t`, `\\x9b`, `\\u202e`), so a field stays on its line; with
    `lines` (a job's output), LF and tab are kept."""
    if text.isprintable():  # the usual case, checked in C
        return text
    return (UNSAFE_IN_LINES if lines else UNSAFE_TEXT).sub(_escape, text)


def _escape(match: re.Match) -> str:
    code = ord(match[0])
    return NAMED_ESCAPES.get(match[0]) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# ==== Rules and validation =======================================================================
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
    if attempts >= max(job.max_retries, 1) or outcome.stuck:  # a retry could overlap what is left of it
        return DEAD, attempts, job.next_run_at
    delay = backoff_delay(attempts, settings["backoff_base"], settings["backoff_max"])
    return FAILED, attempts, now + delay


def eligible_at(job: Job) -> float:
    """When a waiting job became eligible to run, the moment its wait is counted from: the later of
    its due time and its enqueue. Every later return to waiting (a retry, a requeue, `dlq retry`, a
    dependency completing) moves next_run_at to that moment or after, so only an enqueue's run_at
    can lie before the wait began; claims still order by next_run_at (the SQL says the same)."""
    return max(job.next_run_at, job.created_at)


def percentiles(values) -> tuple:
    """(max, p50, p95) by rank: the smallest value with at least that share of values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return None, None, None
    def rank(q: float) -> float:
        return ordered[max(math.ceil(len(ordered) * q), 1) - 1]
    return ordered[-1], rank(0.5), rank(0.95)


def interrupt_rule(lost_total: int, lost: bool, canceled: bool, stuck: str | None = None,
                   cancel_error: str = "canceled") -> tuple[str, str | None]:
    """(state, last_error) for an interrupted run: canceled -> DLQ (`cancel_error` says how it ended,
    "canceled (terminated)"); lost too often -> DLQ; a leftover process that could not be killed
    (`stuck`) -> DLQ, as a rerun could overlap it; else pending."""
    if stuck:
        return DEAD, stuck
    if canceled:
        return DEAD, cancel_error
    if lost and lost_total >= LOST_WORKER_CAP:
        return DEAD, f"worker lost {lost_total} times (the job may be killing its worker)"
    return PENDING, None


def lease_expired(last_change_mono: float, now_mono: float, stale_timeout_s: float, stalled_s: float = 0.0) -> bool:
    """True if a heartbeat counter has not moved for stale_timeout_s of *our* monotonic clock,
    not counting the `stalled_s` of that time during which we could not commit our own heartbeat.

    We never compare another host's wall clock with ours: clock steps and skew cannot kill a
    live worker, only a heartbeat that stops changing can. And while a long write (a huge batch
    enqueue) holds the database, no worker can beat: that time is nobody's fault.
    """
    return now_mono - last_change_mono - stalled_s > stale_timeout_s


JOB_FIELDS = ("command", "id", "max_retries", "timeout", "cwd", "env", "priority", "queue", "run_at", "delay",
              "depends_on", "on_dead")
JOB_FIELD_SET = frozenset(JOB_FIELDS)


def validate_job(obj: object, defaults: dict, cwd: str, now: float) -> dict:
    """Check an enqueue JSON object field by field; returns a complete spec or raises UsageError."""
    if not isinstance(obj, dict):
        raise UsageError("job must be a JSON object")
    refuse_unknown_fields(obj, JOB_FIELDS, JOB_FIELD_SET)
    if "command" not in obj:
        raise UsageError("field 'command' is required")
    if "run_at" in obj and "delay" in obj:
        raise UsageError("fields 'run_at' and 'delay' cannot be used together")
    return {
        "command": _valid_command(obj["command"]),
        "id": _valid_job_id(obj["id"]) if "id" in obj else os.urandom(8).hex(),
        "max_retries": _valid_int(obj.get("max_retries", defaults["max_retries"]), "max_retries", 0, MAX_RETRIES_LIMIT),
        "timeout": _valid_seconds(obj.get("timeout", defaults["job_timeout"]), "timeout"),
        "cwd": _valid_cwd(obj["cwd"]) if "cwd" in obj else _default_cwd(cwd),
        "env": _valid_env(obj.get("env", {})),
        "priority": _valid_int(obj.get("priority", 0), "priority", -MAX_PRIORITY, MAX_PRIORITY),
        "queue": valid_queue(obj.get("queue", DEFAULT_QUEUE), "field 'queue'"),
        "run_at": _valid_run_at(obj, now),
        "depends_on": _valid_deps(obj["depends_on"]) if "depends_on" in obj else [],
        "on_dead": valid_on_dead(obj["on_dead"]) if "on_dead" in obj else None,
    }


QUICK_FIELDS = frozenset(("command", "id", "queue", "priority"))  # the fields a batch's jobs usually have


def job_validator(defaults: dict, cwd: str, now: float) -> Callable[[object], dict]:
    """validate_job for a batch of jobs, about three times faster on the common path: a job object with
    only QUICK_FIELDS, of plain ASCII text and integers in range, is accepted inline, with the defaults
    validated once. Anything else, and so every error, goes through validate_job: the same rules and
    messages."""
    try:
        base = validate_job({"command": "true"}, defaults, cwd, now)
    except UsageError:  # a default is not valid (the current folder is gone): each job is told by validate_job
        base = None
    queues = {DEFAULT_QUEUE}  # names already found valid
    ids = _random_ids()

    def validate(obj: object) -> dict:
        if base is None or type(obj) is not dict or not obj.keys() <= QUICK_FIELDS or not _quick_ok(obj, queues):
            return validate_job(obj, defaults, cwd, now)
        return {"command": obj["command"], "id": obj["id"] if "id" in obj else next(ids),
                "max_retries": base["max_retries"], "timeout": base["timeout"], "cwd": base["cwd"], "env": {},
                "priority": obj.get("priority", 0), "queue": obj.get("queue", DEFAULT_QUEUE), "run_at": None,
                "depends_on": [], "on_dead": None}
    return validate


def _quick_ok(obj: dict, queues: set) -> bool:
    """True if validate_job surely accepts these QUICK_FIELDS as they are (False: let it decide)."""
    command = obj.get("command")
    if not (type(command) is str and 0 < len(command) <= MAX_COMMAND_BYTES and command.isascii()
            and "\0" not in command and not command.isspace()):  # ASCII: as many UTF-8 bytes as characters
        return False
    if "id" in obj:
        job_id = obj["id"]  # printable ASCII: no control character, line separator or NUL
        if not (type(job_id) is str and 0 < len(job_id) <= MAX_ID_CHARS and job_id.isascii() and job_id.isprintable()
                and "@dead-" not in job_id):  # maybe a notification job's (NOTICE_ID)
            return False
    if "priority" in obj:
        priority = obj["priority"]  # type(...) is int: not a bool
        if not (type(priority) is int and -MAX_PRIORITY <= priority <= MAX_PRIORITY):
            return False
    queue = obj.get("queue", DEFAULT_QUEUE)
    if type(queue) is not str or queue not in queues and not QUEUE_NAME.fullmatch(queue):
        return False
    queues.add(queue)
    return True


def _random_ids() -> Iterator[str]:
    """Job ids as validate_job draws them (8 random bytes in hex), from the system 4 KiB at a time."""
    while True:
        block = os.urandom(4096).hex()
        yield from (block[i:i + 16] for i in range(0, len(block), 16))


def refuse_unknown_fields(obj: dict, fields: tuple, known: set | frozenset) -> None:
    """UsageError for the first field of `obj` not in `known` (the set of `fields`), naming the nearest
    valid one or listing them all."""
    unknown = obj.keys() - known
    if unknown:
        name = min(unknown)
        hint = did_you_mean(name, fields) or f"(fields: {', '.join(fields)})"
        raise UsageError(f"unknown field {name!r} {hint}")


def did_you_mean(name: str, valid) -> str:
    """"(did you mean 'x'?)" for the valid name nearest a mistyped one, or "" if none is near (case
    aside: `MAX-RETRIES` is near `max-retries`)."""
    import difflib  # only on this error path: its import costs start-up time
    lowered = {str(v).lower(): v for v in valid}
    # Two letters swapped (stauts) first: difflib's ratio would prefer the shorter `stats`.
    close = ([k for k in lowered if sorted(k) == sorted(name.lower())]
             or difflib.get_close_matches(name.lower(), list(lowered), n=1))
    return f"(did you mean {lowered[close[0]]!r}?)" if close else ""


def _valid_run_at(obj: dict, now: float) -> float | None:
    """Unix seconds the job becomes due, from `run_at` (ISO-8601 or Unix seconds) or `delay`; None = now."""
    if "delay" in obj:
        return now + _valid_seconds(obj["delay"], "delay")
    if "run_at" not in obj:
        return None
    return parse_time(obj["run_at"], "field 'run_at'")


def parse_time(value: object, what: str) -> float:
    """An ISO-8601 string (no offset: local time) or a number of Unix seconds -> Unix seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{what} must be an ISO-8601 string or a Unix time in seconds")
    if not isinstance(value, str):
        return float(parse_number(value, what, 0, MAX_UNIX_TIME))
    if not (value.isascii() and value.isprintable()):
        raise UsageError(f"{what} is not an ISO-8601 time: {shown(value)}")
    try:
        parsed = datetime.fromisoformat(value)
        try:
            seconds = parsed.timestamp()  # no offset: local time
        except (ValueError, OverflowError):
            if parsed.tzinfo is not None:
                raise
            # East of UTC, datetime fails late on 9999-12-31 (its conversion passes through year
            # 10000); the C library's has no such limit.
            seconds = time.mktime(parsed.timetuple())
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{what} is not an ISO-8601 time: {shown(value)}") from None
    if not 0 <= seconds <= MAX_UNIX_TIME:
        raise UsageError(f"{what}: time {shown(value)} is out of range (1970-01-01 to 9999-12-31 UTC)")
    return seconds


def _valid_deps(value: object) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_DEPS:
        raise UsageError(f"field 'depends_on' must be a list of at most {MAX_DEPS} job ids")
    return list(dict.fromkeys(_valid_id(v, f"depends_on[{i}]") for i, v in enumerate(value)))


def valid_queue(value: object, what: str) -> str:
    """A queue name: letters, digits, '-', '_', '.', 1 to 64 characters."""
    if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
        raise UsageError(f"{what} must be 1-64 letters, digits, '-', '_' or '.': {value!r}")
    return value


def parse_duration(value: object, what: str = "", low: float = 0, high: float = MAX_SECONDS) -> float | int:
    """Seconds from a number (a JSON field) or a string of a number with at most one unit: 90, '90',
    '90s', '15m', '2h', '1d', '1w'. The one parser of every time span queuectl takes (job fields, flags,
    config keys), and its one range check, from low to high seconds (default 0 to 10 years); UsageError
    naming the value (and `what`, e.g. "field 'delay'", when given)."""
    where = f"{what}: " if what else ""
    match = DURATION.fullmatch(value) if isinstance(value, str) else None
    if match:
        seconds = float(match[1]) * DURATION_UNITS[match[2] or "s"]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = value
    else:
        raise UsageError(f"{where}not a duration: {shown(value)} (use seconds, or one unit: 90s, 15m, 2h, 1d, 1w)")
    if not low <= seconds <= high:  # also refuses NaN
        years = ", 10 years" if high == MAX_SECONDS else ""
        raise UsageError(f"{where}duration out of range: {shown(value)} ({low} to {high} seconds{years})")
    return int(seconds) if seconds == int(seconds) else seconds


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


def _valid_command(value: object, field: str = "command", blank: bool = False) -> str:
    command = _valid_text(value, field)
    if not (blank or command.strip()):
        raise UsageError(f"field {field!r} must not be blank")
    if len(command.encode("utf-8")) > MAX_COMMAND_BYTES:
        raise UsageError(f"field {field!r} is longer than {MAX_COMMAND_BYTES} bytes")
    return command


def valid_on_dead(value: object, field: str = "on_dead") -> str:
    """An on_dead command (a job's field, or config on-dead): a shell command, or "" (blank) for none; a
    job's "" turns config on-dead off for it."""
    command = _valid_command(value, field, blank=True)
    return command if command.strip() else ""


def _valid_id(value: object, field: str = "id") -> str:
    job_id = _valid_text(value, field)
    if not job_id or len(job_id) > MAX_ID_CHARS:
        raise UsageError(f"field {field!r}: an id must be 1 to {MAX_ID_CHARS} characters")
    if UNSAFE_TEXT.search(job_id):  # so that it prints as it is, for scripts that read ids back
        raise UsageError(f"field {field!r}: an id must not contain control characters, line separators or "
                         "direction marks")
    return job_id


def _valid_job_id(value: object) -> str:
    """A new job's id: not one the trigger of migration 6 may give a notification job."""
    job_id = _valid_id(value)
    if NOTICE_ID.search(job_id):
        raise UsageError("field 'id': ids ending in @dead-N-N are reserved for the jobs that tell of a death")
    return job_id


def _valid_int(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, str):  # a JSON integer, as documented: "5" is text (only durations take text)
        raise UsageError(f"field {field!r} must be a JSON integer from {low} to {high}, not a string: "
                         f"{shown(value)}")
    return parse_number(value, f"field {field!r}", low, high, integer=True)


def _valid_seconds(value: object, field: str) -> float:
    return float(parse_duration(value, f"field {field!r}"))


def _default_cwd(cwd: str) -> str:
    if cwd == "":  # current_dir(): the folder was deleted under the shell
        raise UsageError("the current folder no longer exists; give the job a 'cwd'")
    return cwd


def _valid_cwd(value: object) -> str:
    cwd = _valid_text(value, "cwd")
    if not os.path.isabs(cwd):
        raise UsageError("field 'cwd' must be an absolute path")
    return cwd


def _valid_env(value: object) -> dict:
    if not isinstance(value, dict):
        raise UsageError("field 'env' must be an object of strings")
    total = 0
    for key, val in value.items():
        _valid_text(key, "env")
        _valid_text(val, f"env.{key}")
        if not key or "=" in key:
            raise UsageError(f"env name {key!r} must be non-empty and without '='")
        # Refused here, not at every attempt as "cannot start: Argument list too long".
        size = len(key.encode()) + 1 + len(val.encode())
        if size > MAX_COMMAND_BYTES:
            raise UsageError(f"env {key!r}: NAME=VALUE is {size} bytes, more than the system takes in one "
                             f"environment string ({MAX_COMMAND_BYTES})")
        total += size + 1 + 8  # as the kernel counts it: the string's NUL and its pointer in envp
    if total > MAX_ENV_BYTES:
        raise UsageError(f"field 'env' takes {total} bytes of the system's room for it (each NAME=VALUE with "
                         f"its NUL and pointer), more than {MAX_ENV_BYTES}")
    return value


def _no_constant(name: str):
    raise UsageError(f"invalid JSON: {name} is not allowed")


def _no_duplicates(pairs: list) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        keys = [k for k, _ in pairs]
        raise UsageError(f"invalid JSON: duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UsageError(f"invalid JSON: number {text} is out of range")
    return value


STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_no_duplicates, parse_float=_finite)


def parse_json(text: str) -> object:
    """json.loads that rejects NaN/Infinity, out-of-range numbers and duplicate keys."""
    try:
        return STRICT_JSON.decode(text)
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        raise UsageError(f"invalid JSON: {e}") from None
    except RecursionError:
        raise UsageError("invalid JSON: nested too deeply") from None


# -- the config table: every key, its default and its parser ------------------------------------


def parse_number(value: object, what: str, low: float, high: float, *, integer: bool = False) -> float | int:
    """The one parser of every count and number queuectl takes (flags, config keys, job fields, the
    dashboard's parameters): a JSON number, or a string of ASCII digits with an optional '-' and, unless
    `integer`, a '.fraction' (NUMBER), blanks around it ignored; from low to high. UsageError naming
    `what` (e.g. "field 'priority'") and the value as given."""
    where, kind = f"{what}: " if what else "", "an integer" if integer else "a number"
    if isinstance(value, str) and (match := (INTEGER if integer else NUMBER).fullmatch(value)):
        # int() of more than 4,300 digits raises, and no bound has 30 digits: out of range unconverted
        too_long = integer and len(match[1].lstrip("-").lstrip("0")) > 30
        number = math.inf if too_long else int(match[1]) if integer else float(match[1])
    elif isinstance(value, int if integer else (int, float)) and not isinstance(value, bool):
        number = value
    else:
        raise UsageError(f"{where}not {kind}: {shown(value)}")
    if not low <= number <= high or math.isinf(number):  # also refuses NaN
        # "0 or more" for a count with no bound that matters, unless the value is above the one there is.
        bounds = f", {low} or more" if high >= UNBOUNDED and not number > high else f" from {low} to {high}"
        raise UsageError(f"{where}value {shown(value)} must be {kind}{bounds}")
    return int(number) if number == int(number) else number


def shown(value: object) -> str:
    """A value as an error names it: repr(), the start only of a long one (a 5,000-digit number)."""
    if isinstance(value, str) and len(value) > 64:
        return f"{value[:24]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:24]}… ({len(text)} characters)"


def _output_limit(text: str) -> int:
    size = parse_size(text)
    if not MIN_OUTPUT_LIMIT <= size <= MAX_OUTPUT_LIMIT:
        raise UsageError(f"value {shown(text)} ({size} bytes) must be from 1024 (1 KiB) to 67108864 (64 MiB)")
    return size


def seconds_key(low: float, high: float):
    """The validator of a config key measured in seconds: a duration (90, 15m, 2h, 1d, 1w) from low to high."""
    return lambda text: parse_duration(text, "", low, high)


# key -> (default, validator taking the CLI string and returning the stored value)
CONFIG = {
    "max_retries": (3, lambda s: parse_number(s, "", 0, MAX_RETRIES_LIMIT, integer=True)),
    "backoff_base": (2, lambda s: parse_number(s, "", 1, 1000)),
    "backoff_max": (3600, seconds_key(0, MAX_SECONDS)),
    # At least 1 s: heartbeats come at most every 0.2 s, and a lease must span several of them.
    "stale_timeout": (10, seconds_key(1, 86400)),
    "job_timeout": (0, seconds_key(0, MAX_SECONDS)),
    # How long completed jobs are kept; 0 = forever.
    "retention": (7 * 86400, seconds_key(0, MAX_SECONDS)),
    # the tail of each run's output that is kept, in bytes
    "output_limit": (OUTPUT_TAIL_BYTES, _output_limit),
    # SIGTERM, then this long for a timed-out or canceled job to exit before SIGKILL; 0 = SIGKILL at once.
    "kill_grace": (10, seconds_key(0, 3600)),
    # A shell command run when a job without an on_dead of its own dies (see the migration to schema 6); "" = none.
    "on_dead": ("", lambda text: valid_on_dead(text, "on-dead")),
}


# ==== Schedules ==================================================================================
#
# Recurring jobs. A schedule is a cron expression (read as wall time in an IANA zone) or a fixed
# interval, plus a job template; each slot it reaches enqueues one ordinary job whose id is the
# schedule's id, '@' and the slot's UTC time, so a slot fired by many workers makes one job. The
# parser and the slot arithmetic below are pure functions of their arguments (no clock, no database):
# tests call them with known calendars. Running workers fire schedules (ScheduleFirer, at the end).

SCHEDULE_FIELDS = ("id", "cron", "every", "tz", "overlap")
TEMPLATE_FIELDS = ("command", "max_retries", "timeout", "cwd", "env", "priority", "queue", "on_dead")
MAX_SCHEDULE_ID_CHARS = 170  # with "@2026-12-01T02:00:00Z" a slot's job id stays within MAX_ID_CHARS
OVERLAPS = ("skip", "allow")
SCHEDULE_CHECK_S = 1.0  # a worker looks for due schedules at least this often (one indexed lookup)
SCHEDULES_CHANGED = "schedules"  # a NOTIFY's payload: a schedule was added, changed or resumed (PostgreSQL)
CRON_YEARS = 401  # the Gregorian calendar repeats every 400 years: no slot in 401 means none ever
CRON_ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
                "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names for lowest, lowest + 1, ...) of the five fields, in order
CRON_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
               ("month", 1, 12, MONTH_NAMES), ("day of week", 0, 7, DAY_NAMES))


class Cron(Record):
    """A parsed cron expression: the sorted values each field allows (Sunday is 0, never 7), and
    whether a day matching either day field fires (both restricted) or only one matching both."""
    FIELDS = ("minutes", "hours", "days", "months", "weekdays", "day_or")


@functools.lru_cache(maxsize=256)
def parse_cron(text: str) -> Cron:
    """Five fields (minute hour day-of-month month day-of-week) or an @-alias -> Cron; UsageError
    naming the bad part. As Vixie cron and cronie decide it, a day field whose text starts with '*'
    (`*`, `*/2`) is unrestricted: only when both are restricted does a day matching either fire."""
    fields = CRON_ALIASES.get(text.strip().lower(), text).split()
    if text.strip().startswith("@") and text.strip().lower() not in CRON_ALIASES:
        raise UsageError(f"cron {text!r}: unknown alias (valid: {', '.join(CRON_ALIASES)})")
    if len(fields) != 5:
        raise UsageError(f"cron {text!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
                         f"got {len(fields)}")
    values = [_cron_field(field, *CRON_FIELDS[i], text) for i, field in enumerate(fields)]
    weekdays = tuple(sorted({d % 7 for d in values[4]}))
    day_or = not fields[2].startswith("*") and not fields[4].startswith("*")
    return Cron(*values[:4], weekdays, day_or)


def _cron_field(field: str, name: str, low: int, high: int, names: tuple, text: str) -> tuple[int, ...]:
    """One field's comma-separated items (`*`, `N`, `A-B`, each with an optional `/STEP`) -> sorted values."""
    found: set[int] = set()
    for item in field.split(","):
        span, _, step = item.partition("/")
        if span == "*":
            first, last = low, high
        else:
            start, dash, end = span.partition("-")
            first = _cron_value(start, name, low, high, names, text)
            # `N/STEP` runs from N to the field's end, as in croniter and systemd
            last = _cron_value(end, name, low, high, names, text) if dash else high if "/" in item else first
        if first > last:
            raise UsageError(f"cron {text!r}: {name} range {span!r} runs backwards (no wrapping past {high})")
        every = _cron_value(step, f"{name} step", 1, high - low + 1, (), text) if "/" in item else 1
        found.update(range(first, last + 1, every))
    return tuple(sorted(found))


def _cron_value(word: str, name: str, low: int, high: int, names: tuple, text: str) -> int:
    if word.lower() in names:
        return low + names.index(word.lower())
    try:
        return parse_number(word, "", low, high, integer=True)
    except UsageError:
        allowed = f" or {names[0]}-{names[-1]}" if names else ""
        raise UsageError(f"cron {shown(text)}: {name} {shown(word)} is not a number from {low} to {high}{allowed}") \
            from None


def cron_day_matches(cron: Cron, day) -> bool:
    """Whether `cron` fires on this date (the day-of-month / day-of-week rule above)."""
    in_month, in_week = day.day in cron.days, (day.weekday() + 1) % 7 in cron.weekdays
    return (in_month or in_week) if cron.day_or else (in_month and in_week)


def cron_walls(cron: Cron, start: datetime, years: int = CRON_YEARS) -> Iterator[datetime]:
    """The wall times (naive, whole minutes) that `cron` names from `start` on, ascending, for at
    most `years` years: whole months and days that cannot match are skipped, not walked."""
    day, first, end = start.date(), (start.hour, start.minute), start.year + years
    while day is not None and day.year < end:
        if day.month not in cron.months:
            day, first = _month_after(day), (0, 0)
            continue
        if cron_day_matches(cron, day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    if (hour, minute) >= first:
                        yield datetime(day.year, day.month, day.day, hour, minute)
        day, first = _day_after(day), (0, 0)


def _day_after(day: date) -> date | None:
    """The next date; None after the calendar's last day (31 December 9999), where the walk ends."""
    from datetime import timedelta
    return None if day == date.max else day + timedelta(days=1)


def _month_after(day: date) -> date | None:
    """The first day of the next month; None in the calendar's last month."""
    from datetime import timedelta
    if (day.year, day.month) == (date.max.year, 12):
        return None
    return (day.replace(day=1) + timedelta(days=32)).replace(day=1)


def wall_instant(wall: datetime, zone) -> float:
    """Unix seconds at which a zone's clocks show `wall`: its first occurrence when they show it
    twice (fall back), and the first minute after it when they skip it (spring forward)."""
    from datetime import timedelta
    while True:
        at = wall.replace(tzinfo=zone)  # fold=0: the earlier of two occurrences
        if at.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None) == wall:
            return at.timestamp()
        wall += timedelta(minutes=1)  # skipped: a gap is an hour or so, a day at most


def next_cron_slot(cron: Cron, zone, after: float) -> float | None:
    """The first slot of `cron` in `zone` strictly after `after` (Unix seconds); None if none comes."""
    try:
        start = datetime.fromtimestamp(after, zone).replace(tzinfo=None, second=0, microsecond=0)
    except OverflowError:  # east of UTC, the last storable seconds are already year 10000 on the clock
        return None
    # Walls in a repeated hour map to its first pass, which may lie before `after`: skip those.
    instants = (wall_instant(wall, zone) for wall in cron_walls(cron, start))
    try:
        slot = next((at for at in instants if at > after), None)
    except OverflowError:  # west of UTC, the calendar's last walls are already year 10000 in UTC
        return None
    return slot if slot is not None and slot <= MAX_UNIX_TIME else None


def next_every_slot(anchor: float, every_s: int, after: float) -> float:
    """The first of anchor + k * every_s (k >= 1) strictly after `after`."""
    return anchor + every_s * max(1, math.floor((after - anchor) / every_s) + 1)


def next_slot(schedule: Schedule, after: float) -> float | None:
    """The schedule's first slot strictly after `after`; None if it has no more (none before year 10000)."""
    if schedule.every_s:
        slot = next_every_slot(math.floor(schedule.created_at), schedule.every_s, after)
        return slot if slot <= MAX_UNIX_TIME else None
    return next_cron_slot(parse_cron(schedule.cron), zone_of(schedule.tz), after)


def last_slot(following, slot: float, now: float) -> float:
    """The last slot at or before `now`, given `slot`, one at or before it, and following(t), the
    first slot after t. Each step halves the time left to search, so a worker that missed a year of
    minutely slots takes a few dozen steps, not half a million."""
    high = now  # no slot lies in (high, now]
    while (nxt := following(slot)) is not None and nxt <= high:
        slot = nxt
        middle = slot + (high - slot) / 2
        later = following(middle)
        if later is not None and later <= high:
            slot = later
        else:
            high = middle
    return slot


def firing_rule(schedule: Schedule, now: float) -> tuple[float | None, float | None]:
    """(slot to fire or None, next slot) for a schedule due at `now`: of several missed slots only the
    latest fires (once); with overlap 'skip' none fires while the last job is not completed or dead."""
    slot = last_slot(lambda t: next_slot(schedule, t), schedule.next_run_at, now)
    busy = schedule.overlap == "skip" and schedule.last_job_state in (PENDING, PROCESSING, FAILED)
    return (None if busy else slot), next_slot(schedule, max(slot, now))


def slot_text(slot: float) -> str:
    """A slot as its jobs' ids end: UTC to the second, `2026-12-01T02:00:00Z`."""
    return datetime.fromtimestamp(int(slot), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_of(text: str) -> float | None:
    """The slot a job id names after its '@', if written exactly as slot_text writes one; else None."""
    try:
        slot = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    return slot if slot_text(slot) == text else None  # strptime also takes "2026-1-5T2:0:0Z"


def slot_job(schedule: Schedule, slot: float, defaults: dict) -> dict:
    """The job spec a slot enqueues: the template, with config defaults as of now, due at the slot."""
    job = {**schedule.job, "id": f"{schedule.id}@{slot_text(slot)}", "run_at": slot}
    return validate_job(job, defaults, schedule.job["cwd"], slot)


def zone_of(name: str):
    """The ZoneInfo of an IANA zone name; UsageError if there is none of that name here."""
    import zoneinfo
    if name == "localtime":  # a different zone on each host: never what a shared schedule means
        raise UsageError("zone 'localtime' names no zone; give an IANA name such as Europe/Berlin")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise UsageError(f"unknown time zone {name!r} (use an IANA name such as Europe/Berlin or UTC)") from None


def local_zone_name() -> str:
    """This machine's zone, as `tz` defaults to: $TZ (a zone name, or a file such as :/etc/localtime), else
    what /etc/localtime links to (UTC if absent)."""
    name = os.environ.get("TZ", "").removeprefix(":")
    if name and not name.startswith("/"):
        return name
    path = name or "/etc/localtime"
    if "zoneinfo/" in path:
        return path.partition("zoneinfo/")[2]
    try:  # /etc/localtime, also when $TZ names it: `TZ=:/etc/localtime` is a common setting
        target = os.readlink(path)
    except FileNotFoundError:
        return "UTC"  # what the C library assumes without it
    except OSError:  # a copy, not a link: Debian also names it in /etc/timezone
        with contextlib.suppress(OSError):
            with open("/etc/timezone", encoding="utf-8") as f:
                return f.read().strip()
        raise UsageError("cannot tell this machine's time zone; give the schedule a 'tz'") from None
    return target.rpartition("zoneinfo/")[2]


def _valid_zone(obj: dict) -> str:
    """`tz`, or this machine's zone when it is absent; either must be a zone name known here."""
    if "tz" in obj:
        _valid_text(obj["tz"], "tz")
        try:
            zone_of(obj["tz"])
        except UsageError as e:
            raise UsageError(f"field 'tz': {e}") from None
        return obj["tz"]
    name = local_zone_name()
    try:
        zone_of(name)
    except UsageError:
        raise UsageError(f"this machine's time zone {name!r} ($TZ or /etc/localtime) is not an IANA zone name; "
                         "give the schedule a 'tz'") from None
    return name


def parse_every(value: object, what: str = "field 'every'") -> int:
    """`every`: a duration (parse_duration) of whole seconds, at least 1 s: 30s, 15m, 2h, 1d, 1w or seconds."""
    if isinstance(value, float) or isinstance(value, str) and "." in value:
        raise UsageError(f"{what} must be whole seconds (e.g. 30s, 15m, 2h, 1d, 1w): {value!r}")
    return int(parse_duration(value, what, 1))


def validate_schedule(obj: object, defaults: dict, cwd: str, now: float) -> Schedule:
    """Check a `schedule add` object; returns the Schedule to store, its first slot computed."""
    if not isinstance(obj, dict):
        raise UsageError("schedule must be a JSON object")
    refused = sorted(obj.keys() & {"run_at", "delay", "depends_on"})
    if refused:
        raise UsageError(f"field {refused[0]!r} cannot be used in a schedule (its slots set when jobs run)")
    fields = SCHEDULE_FIELDS + TEMPLATE_FIELDS
    refuse_unknown_fields(obj, fields, set(fields))
    if "id" not in obj:
        raise UsageError("field 'id' is required")
    if ("cron" in obj) == ("every" in obj):
        raise UsageError("a schedule needs exactly one of the fields 'cron' and 'every'")
    schedule_id = _valid_id(obj["id"])
    if len(schedule_id) > MAX_SCHEDULE_ID_CHARS:
        raise UsageError(f"field 'id': a schedule id must be 1 to {MAX_SCHEDULE_ID_CHARS} characters")
    template = {key: obj[key] for key in TEMPLATE_FIELDS if key in obj}
    template["cwd"] = validate_job(template, defaults, cwd, now)["cwd"]  # every field checked; cwd kept
    tz = _valid_zone(obj)
    overlap = obj.get("overlap", "skip")
    if overlap not in OVERLAPS:
        raise UsageError(f"field 'overlap' must be 'skip' or 'allow': {overlap!r}")
    # stored with its fields one space apart: any whitespace parses, but a newline must not reach `schedule list`
    cron = " ".join(_valid_text(obj["cron"], "cron").split()) if "cron" in obj else None
    every_s = parse_every(obj["every"]) if "every" in obj else None
    schedule = Schedule(schedule_id, cron, every_s, tz, overlap, template, now, False, None, None, None, None)
    schedule.next_run_at = first_slot(schedule, now)
    return schedule


def first_slot(schedule: Schedule, now: float) -> float:
    """The schedule's first slot after `now`; UsageError if a slot never comes (a cron no date matches)."""
    slot = next_slot(schedule, now)
    if slot is None:
        raise UsageError(f"cron {schedule.cron!r} never fires (no such day in {CRON_YEARS} years)")
    return slot


def expression_schedule(cron: str | None, every: str | None, tz: str | None, now: float) -> Schedule:
    """The schedule `schedule next --cron|--every` shows, as `schedule add` would make it at `now`; not stored."""
    every_s = parse_every(every, "--every") if every is not None else None
    if cron is not None:
        cron = " ".join(_valid_text(cron, "--cron").split())
        parse_cron(cron)  # its message names the bad field
        local = tz is None
        tz = local_zone_name() if local else _valid_text(tz, "--tz")
        try:
            zone_of(tz)
        except UsageError as e:
            raise UsageError(f"this machine's time zone {tz!r} ($TZ or /etc/localtime) is not an IANA zone name; "
                             "give --tz" if local else str(e)) from None
    schedule = Schedule(None, cron, every_s, tz or "UTC", "skip", {}, now, False, None, None, None, None)
    schedule.next_run_at = first_slot(schedule, now)
    return schedule


def every_text(seconds: int) -> str:
    """An interval in its largest whole unit: 1800 -> '30m'."""
    unit = next(u for u in "wdhms" if seconds % DURATION_UNITS[u] == 0)
    return f"{seconds // DURATION_UNITS[unit]}{unit}"


# ==== Process identity ===========================================================================
# A worker on the same boot and PID namespace as us can be checked directly through /proc; any
# other worker is judged by its heartbeat lease only.

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on, or None if the process is gone. The command name
    before it is in parentheses and may hold spaces or ')', hence the split at the last ')'."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[-1].split() if stat else None


def proc_start_time(pid: int) -> str | None:
    """Start time of a live process (clock ticks since boot) or None if gone or a zombie."""
    fields = _stat_fields(pid)
    # fields[0] is the state (field 3); a zombie has exited even if nobody reaped it, unless only its
    # main thread has: its other threads keep its memory, files and locks
    if not fields or fields[0] in ("Z", "X") and len(_threads(pid)) < 2:
        return None
    return fields[19]


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def host_identity() -> dict:
    """Who this process is, for other workers to decide whether it is still alive."""
    ns = None
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return {"host": os.uname().nodename, "pid": os.getpid(), "proc_start": proc_start_time(os.getpid()),
            "boot_id": _read("/proc/sys/kernel/random/boot_id"), "pid_ns": ns}


def previous_boot(row: WorkerRow, me: dict) -> bool:
    """True if the worker ran on this host before its last reboot: every process of it is gone.

    The database lives on a local disk, so a row with our hostname and another boot id can only
    come from an earlier boot of this machine.
    """
    return bool(me["boot_id"] and row.boot_id) and row.host == me["host"] and row.boot_id != me["boot_id"]


def same_namespace(row: WorkerRow, me: dict) -> bool:
    """True if the worker ran on this boot in this PID namespace, so its PID means the same here."""
    return bool(me["boot_id"] and me["pid_ns"]) and (row.boot_id, row.pid_ns, row.host) == (
        me["boot_id"], me["pid_ns"], me["host"])


def looks_alive(row: WorkerRow | OlderWorker, me: dict, now: float, stale_s: float) -> bool:
    """Whether a registered worker looks alive to a command, which sees it once: in our PID namespace by its
    PID (gone, a zombie, or another process: dead), elsewhere by a heartbeat within stale_s of `now`."""
    if same_namespace(row, me):
        return not process_gone(row.pid, row.proc_start)
    return now - row.heartbeat_at <= stale_s


def process_gone(pid: int, start: str | None) -> bool:
    """True if `pid` is gone, a zombie, or now a different process (start time differs)."""
    return proc_start_time(pid) != start


# ==== Wake-ups ===================================================================================
# A worker on SQLite binds a datagram socket in Linux's abstract namespace, named after the database
# file and its worker id, and a commit that makes a job due sends each worker of this host an empty
# datagram (see SqliteStore._wake_workers). A hint only: any local user may send one, and it makes the
# worker look, never claim; a worker that cannot be reached (another network namespace, such as a
# container's) finds the job at its regular check (POLL_INTERVAL_S). PostgreSQL's workers LISTEN instead.

WAKE_ADDRESS_MAX = 108  # sizeof(sun_path): an abstract name is its leading NUL and up to 107 bytes


def wake_address(db: os.stat_result, worker_id: str) -> bytes:
    """The abstract socket name of a worker of the database file `db`: the file's device and inode, so
    every path to it agrees, and the worker id's pid and random part (every name read is of this host)."""
    tail = ":".join(worker_id.rsplit(":", 2)[-2:])
    return f"\0queuectl/{db.st_dev:x}:{db.st_ino:x}/{tail}".encode(errors="replace")[:WAKE_ADDRESS_MAX]


class WakeSender:
    """The socket a Store sends its wake-ups from, opened once: never waits, and ignores every error."""

    def __init__(self):
        try:
            import _socket  # not socket, whose imports cost a one-job enqueue more than the send itself
            self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
            self.sock.setblocking(False)  # a worker's full queue has wake-ups enough: never wait for room
        except (ImportError, OSError, AttributeError):  # no AF_UNIX, or no descriptor left
            self.sock = None

    def send(self, db_path: str, worker_ids: list[str]) -> None:
        """An empty datagram to each worker of the database file at db_path (see wake_address)."""
        try:
            db = os.stat(db_path)
        except OSError:
            return
        for worker_id in worker_ids if self.sock else ():
            with contextlib.suppress(OSError):  # gone, full, or not in our network namespace: a hint only
                self.sock.sendto(b"", wake_address(db, worker_id))

    def close(self) -> None:
        """Close the socket."""
        if self.sock:
            self.sock.close()


# ==== Storage ====================================================================================

MIGRATIONS = [
    # 1: jobs, their dependencies and runs, workers, paused queues, config. `seq` gives enqueue
    # order. A waiting job is either staged (not due yet: jobs_staged, by due time) or ready (due:
    # jobs_claim, by queue and then in claim order); see "The claim" below.
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
        lost_count INTEGER NOT NULL DEFAULT 0,
        priority INTEGER NOT NULL DEFAULT 0,
        queue TEXT NOT NULL DEFAULT 'default',
        waiting_on INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        ready INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_claim ON jobs (queue, priority DESC, next_run_at, seq)
        WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1;
    CREATE INDEX jobs_staged ON jobs (next_run_at)
        WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0;
    CREATE INDEX jobs_state ON jobs (state, seq);
    CREATE INDEX jobs_worker ON jobs (worker_id) WHERE state = 'processing';
    CREATE INDEX jobs_finished ON jobs (state, updated_at) WHERE state IN ('completed', 'dead');
    CREATE TABLE deps (
        job_id TEXT NOT NULL,
        dep_id TEXT NOT NULL,
        PRIMARY KEY (job_id, dep_id)
    );
    CREATE INDEX deps_dep ON deps (dep_id);
    CREATE TABLE runs (
        job_id TEXT NOT NULL,
        run_no INTEGER NOT NULL,
        worker_id TEXT NOT NULL,
        started_at REAL NOT NULL,
        due_at REAL NOT NULL,
        ended_at REAL,
        outcome TEXT,
        exit_code INTEGER,
        error TEXT,
        output BLOB,
        output_bytes INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, run_no)
    );
    CREATE INDEX runs_ended ON runs (ended_at);
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
    CREATE TABLE paused (queue TEXT PRIMARY KEY);
    CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 2: per-queue concurrency limits (`queuectl limit`); jobs_running counts a queue's processing
    # jobs for the claim, an index range as long as the queue's limit.
    """
    CREATE TABLE queue_limits (queue TEXT PRIMARY KEY, max_running INTEGER NOT NULL);
    CREATE INDEX jobs_running ON jobs (queue) WHERE state = 'processing';
    """,
    # 3: recurring schedules (see "Schedules"). `job` is the template as JSON; next_run_at is the next
    # slot to fire (NULL when none comes); schedules_due makes "is any due?" one index lookup.
    """
    CREATE TABLE schedules (
        id TEXT PRIMARY KEY,
        cron TEXT,
        every_s INTEGER,
        tz TEXT NOT NULL,
        overlap TEXT NOT NULL,
        job TEXT NOT NULL,
        created_at REAL NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        next_run_at REAL,
        last_run_at REAL,
        last_job_id TEXT
    );
    CREATE INDEX schedules_due ON schedules (next_run_at) WHERE paused = 0;
    """,
    # 4: the queues a worker serves (`worker start --queue`), a JSON list; NULL = every queue.
    "ALTER TABLE workers ADD COLUMN queues TEXT",
    # 5: each worker's queuectl version (`worker list`). A row without one comes from a queuectl older than
    # this schema that registered after the migration found none of its kind alive (it had opened the file
    # just before): the trigger refuses it, so no worker of an older schema runs on this one. A list of
    # statements: the trigger's body holds semicolons.
    ["ALTER TABLE workers ADD COLUMN version TEXT",
     "CREATE TRIGGER workers_versioned BEFORE INSERT ON workers WHEN NEW.version IS NULL BEGIN "
     "SELECT RAISE(ABORT, 'this queue was upgraded by a newer queuectl: start workers of that version'); END"],
    # 6: on_dead. A job's on_dead (NULL: config on-dead's); `revived` counts its `dlq retry`s; `notifies` is,
    # on a notification job, the id of the job whose death made it. jobs_dead is the one place that sees
    # every death (whichever statement makes it: a failure, a cancel, a lost run, a dependency's death) and
    # makes the notification job in the death's own transaction, so it is never lost nor made twice: its id
    # is the dead job's (cut to leave room), '@dead-', its seq and its revival count, one per death (seq
    # is never reused while the notification that names it exists), and a second insert of it does
    # nothing. A notification's own death makes none. Its max_retries and timeout are config's (with
    # today's defaults where unset), its cwd the dead job's. It tells of the run that died (OLD.state
    # 'processing'): its exit code (none for an interrupted run) and, in QUEUECTL_DEAD_RUN, the run whose
    # output its runner gives it on stdin (see Store.dead_output); a death without a run of its own (a
    # waiting job canceled, a dependency's death) tells none, not an earlier attempt's: that attempt
    # failed and was retried, it did not die. jobs_notices: the claim's exemption of
    # notifications from pauses and limits (see SQL_NEXT_DUE), one seek in a nearly empty index.
    ["ALTER TABLE jobs ADD COLUMN on_dead TEXT",
     "ALTER TABLE jobs ADD COLUMN revived INTEGER NOT NULL DEFAULT 0",
     "ALTER TABLE jobs ADD COLUMN notifies TEXT",
     "CREATE INDEX jobs_notices ON jobs (queue, priority DESC, next_run_at, seq) "
     "WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1",
     """CREATE TRIGGER jobs_dead AFTER UPDATE OF state ON jobs
     WHEN NEW.state = 'dead' AND OLD.state <> 'dead' AND NEW.notifies IS NULL BEGIN
     INSERT OR IGNORE INTO jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at,
         next_run_at, priority, queue, waiting_on, ready, notifies)
     SELECT substr(NEW.id, 1, 200 - length(n.suffix)) || n.suffix, n.command, 'pending',
         coalesce((SELECT json_extract(value, '$') FROM config WHERE key = 'max_retries'), 3),
         coalesce((SELECT json_extract(value, '$') FROM config WHERE key = 'job_timeout'), 0), NEW.cwd,
         json_object('QUEUECTL_DEAD_JOB_ID', NEW.id, 'QUEUECTL_DEAD_QUEUE', NEW.queue,
                     'QUEUECTL_DEAD_ATTEMPTS', CAST(NEW.attempts AS TEXT),
                     'QUEUECTL_DEAD_EXIT_CODE', CASE WHEN OLD.state = 'processing'
                                                     THEN coalesce(CAST(NEW.exit_code AS TEXT), '') ELSE '' END,
                     'QUEUECTL_DEAD_ERROR', coalesce(NEW.last_error, ''),
                     'QUEUECTL_DEAD_RUN', CASE WHEN OLD.state = 'processing' THEN CAST(NEW.run_count AS TEXT)
                                               ELSE '0' END),
         NEW.updated_at, NEW.updated_at, NEW.updated_at, NEW.priority, NEW.queue, 0, 1, NEW.id
     FROM (SELECT coalesce(NEW.on_dead, (SELECT json_extract(value, '$') FROM config WHERE key = 'on_dead'), '')
                      AS command, '@dead-' || NEW.seq || '-' || NEW.revived AS suffix) AS n
     WHERE n.command <> '';
     END"""],
]

# The parameter marks of SharedSQL's and PostgresSQL's statements: %s in the order the rules pass
# them, or %(name)s where a statement takes a dict. sqlite_marks writes them as SQLite's; PgPipeline
# numbers them for libpq ($1, $2, …).
PG_PARAM_MARK = re.compile(r"%\((\w+)\)s|%s")


def sqlite_marks(sql: str) -> str:
    """A statement written with PostgreSQL's parameter marks, with SQLite's: ? for %s, :name for %(name)s."""
    return PG_PARAM_MARK.sub(lambda mark: f":{mark[1]}" if mark[1] else "?", sql)


def with_shared(marks: Callable[[str], str]):
    """A class decorator for a dialect's class of statements: it gets each of SharedSQL's, its parameter
    marks written by `marks`. A name the dialect also writes is refused: each statement has one source."""
    def add_shared(dialect: type) -> type:
        for name, sql in vars(SharedSQL).items():
            if name.startswith("SQL_"):
                if name in vars(dialect):
                    raise TypeError(f"{dialect.__name__}.{name} is also SharedSQL's")
                setattr(dialect, name, marks(sql))
        return dialect
    return add_shared


class SharedSQL:
    """The statements both dialects run as they are, each written once, with PostgreSQL's parameter
    marks (see PG_PARAM_MARK): PostgresSQL takes them as written, SqliteSQL with SQLite's marks
    (sqlite_marks). A statement whose text differs between the dialects in anything but its marks is
    written out in each dialect's class instead, complete there. A statement with a {where} or {queue}
    slot takes a clause of _where or _and_queue."""

    SQL_INSERT_JOB = (
        "INSERT INTO jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at, next_run_at, "
        "priority, queue, waiting_on, last_error, ready, on_dead) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
    SQL_GET_JOB = f"SELECT {Job.COLUMNS} FROM jobs WHERE id = %s"
    SQL_COUNTS = "SELECT state, count(*) FROM jobs {where} GROUP BY state"
    # The dashboard's job table: newest first, one page at a time.
    SQL_PAGE_JOBS = f"SELECT {Job.COLUMNS} FROM jobs {{where}} ORDER BY seq DESC LIMIT %s OFFSET %s"
    # `wait --all` ({queue}: nothing, or AND queue = %s). The jobs it answers for are those unfinished
    # when it starts, known by their seq (8 bytes each, not an id), read with the highest seq so far in
    # one statement (one snapshot): a job enqueued later has a higher seq. Its dead ones are found by a
    # range of jobs_state between the lowest seq it answers for and that highest seq, so an old
    # dead-letter queue is not read at every poll. On PostgreSQL, a job whose insert commits after the
    # first statement's snapshot with a lower seq than its max (sequences are handed out before commit)
    # is neither answered for nor counted as arrived: the progress line's total may lag by it; the exit
    # code cannot be wrong.
    # One snapshot: a first row (0, the highest seq so far), then a row (1, seq) per unfinished job.
    SQL_UNFINISHED_SEQS = ("SELECT 0, coalesce(max(seq), 0) FROM jobs UNION ALL "
                           "SELECT 1, seq FROM jobs WHERE state IN ('pending', 'failed', 'processing') {queue}")
    SQL_WAIT_COUNTS = ("SELECT (SELECT count(*) FROM jobs WHERE state IN ('pending', 'failed', 'processing') {queue}), "
                       "(SELECT count(*) FROM jobs WHERE seq > %s {queue})")
    SQL_DEAD_BETWEEN = "SELECT id, seq FROM jobs WHERE state = 'dead' AND seq BETWEEN %s AND %s {queue} ORDER BY seq"

    # --burst: is anything processing (the variant for served queues is each dialect's)?
    SQL_ANY_PROCESSING_ANY_QUEUE = "SELECT 1 FROM jobs WHERE state = 'processing' LIMIT 1"

    SQL_FLUSH_OUTPUT = ("UPDATE runs SET output = %s, output_bytes = %s "
                        "WHERE job_id = %s AND run_no = %s AND ended_at IS NULL")
    # Every write after the claim is guarded by the owner and run number (id, 'processing', worker_id,
    # run_count), so a worker that lost the job (declared dead, then came back) can never overwrite
    # what happened since.
    SQL_FINISH_JOB = ("UPDATE jobs SET state = %s, attempts = %s, next_run_at = %s, last_error = %s, exit_code = %s, "
                      "worker_id = NULL, updated_at = %s, ready = 0 "
                      "WHERE id = %s AND state = 'processing' AND worker_id = %s AND run_count = %s")
    # An interrupted run has no exit code: a job it kills keeps none of an earlier attempt's (see migration 6).
    SQL_REQUEUE = ("UPDATE jobs SET state = %s, lost_count = lost_count + %s, last_error = coalesce(%s, last_error), "
                   "exit_code = CASE WHEN %s = 'dead' THEN NULL ELSE exit_code END, "
                   "next_run_at = %s, worker_id = NULL, updated_at = %s, ready = 0 "
                   "WHERE id = %s AND state = 'processing' AND worker_id = %s AND run_count = %s")
    # A dead job takes every unfinished job below it in the dependency graph with it.
    SQL_KILL_DEPENDENTS = """
        WITH RECURSIVE down(id, cause) AS (
            SELECT job_id, dep_id FROM deps WHERE dep_id = %s
            UNION SELECT deps.job_id, deps.dep_id FROM deps JOIN down ON deps.dep_id = down.id)
        UPDATE jobs SET state = 'dead', updated_at = %s,
            last_error = 'dependency ' || (SELECT cause FROM down WHERE down.id = jobs.id LIMIT 1) || ' is dead'
        WHERE id IN (SELECT id FROM down) AND state IN ('pending', 'failed')"""

    # Recovery of a lost run is decided once: the sweeper that wins it *adopts* the job (worker_id
    # becomes its own, in the transaction that found it lost: each dialect's SQL_ADOPT), so every
    # other sweeper sees a job of a live worker and leaves it alone while the winner kills the run's
    # processes and waits for them to be gone. A run's processes carry the token of the worker that
    # started it (runs.worker_id), which is still known when the adopter itself dies and a third
    # sweeper takes over.
    SQL_HELD_RUNS = ("SELECT jobs.id, jobs.run_count, coalesce(runs.worker_id, jobs.worker_id) FROM jobs "
                     "LEFT JOIN runs ON runs.job_id = jobs.id AND runs.run_no = jobs.run_count "
                     "WHERE jobs.state = 'processing' AND jobs.worker_id = %s")
    SQL_RUN_WORKER = "SELECT worker_id FROM runs WHERE job_id = %s AND run_no = %s"
    SQL_PROCESSING_BY_WORKER = "SELECT worker_id, id FROM jobs WHERE state = 'processing'"
    SQL_CANCEL_REQUESTS = ("SELECT id, run_count FROM jobs WHERE state = 'processing' AND worker_id = %s "
                           "AND cancel_requested = run_count")
    # What a sweep looks at (see Store.swept_jobs), one read: the processing jobs whose worker is not registered
    # (orphans), and those of the sweeping worker, with the worker that started the run: another (an orphan it
    # adopted, not requeued yet), or itself (each must be known to one of its runners, or it is a claim whose
    # answer was lost: see Holdings).
    SQL_SWEPT_JOBS = ("SELECT jobs.id, jobs.run_count, jobs.worker_id, runs.worker_id FROM jobs "
                      "LEFT JOIN runs ON runs.job_id = jobs.id AND runs.run_no = jobs.run_count "
                      "WHERE jobs.state = 'processing' "
                      "AND (jobs.worker_id = %s OR jobs.worker_id NOT IN (SELECT id FROM workers))")
    # A notification's stdin: its dead job's run, found through `notifies`, which only a notification has
    # (a row for each notification, its output NULL when the run is gone or there was none). The run is
    # compared as text: QUEUECTL_DEAD_RUN is in the env, which any job may set to anything (no cast error).
    SQL_DEAD_OUTPUT = ("SELECT runs.output FROM jobs LEFT JOIN runs ON runs.job_id = jobs.notifies "
                       "AND CAST(runs.run_no AS TEXT) = %s WHERE jobs.id = %s AND jobs.notifies IS NOT NULL")
    SQL_RUNS = ("SELECT run_no, worker_id, started_at, due_at, ended_at, outcome, exit_code, error, output, "
                "output_bytes FROM runs WHERE job_id = %s ORDER BY run_no")
    SQL_RUN_END = "SELECT outcome, exit_code, error FROM runs WHERE job_id = %s AND run_no = %s"

    # revived + 1: the job's next death is a new one, with a notification id of its own (see migration 6).
    SQL_RETRY = ("UPDATE jobs SET state = 'pending', attempts = 0, lost_count = 0, cancel_requested = 0, "
                 "revived = revived + 1, next_run_at = %s, last_error = NULL, exit_code = NULL, updated_at = %s, "
                 "ready = 0, waiting_on = (SELECT count(*) FROM deps JOIN jobs d ON d.id = deps.dep_id "
                 "WHERE deps.job_id = jobs.id AND d.state <> 'completed') WHERE id = %s AND state = 'dead'")
    # `dlq retry --all`: the dead jobs (of a queue, or of all when it is NULL) and, in any queue, the dead
    # jobs they depend on, up the graph: a chain is revived together. On PostgreSQL the jobs it finds are
    # locked by SQL_JOB_STATE and SQL_DEAD_DEPS, one by one, and read again (see Store.retry_all_dead).
    SQL_DEAD_CHAINS = """
        WITH RECURSIVE chain(id) AS (
            SELECT id FROM jobs WHERE state = 'dead' AND queue = coalesce(%s, queue)
            UNION SELECT deps.dep_id FROM deps JOIN chain ON deps.job_id = chain.id
                JOIN jobs d ON d.id = deps.dep_id WHERE d.state = 'dead')
        SELECT id FROM jobs WHERE id IN (SELECT id FROM chain) ORDER BY seq"""
    # `cancel --all`: every job that has not finished (of a queue, or of all when it is NULL). No lock:
    # Store.cancel_all locks each job with SQL_JOB_STATE and reads its state again before changing it.
    SQL_UNFINISHED = ("SELECT id FROM jobs WHERE state IN ('pending', 'failed', 'processing') "
                      "AND queue = coalesce(%s, queue) ORDER BY seq")
    SQL_CANCEL_WAITING = ("UPDATE jobs SET state = 'dead', last_error = 'canceled', updated_at = %s "
                          "WHERE id = %s AND state IN ('pending', 'failed')")
    SQL_CANCEL_RUNNING = "UPDATE jobs SET cancel_requested = run_count WHERE id = %s AND state = 'processing'"
    # A job is still needed by a dependent that has not completed, unless it completed itself. (A dead
    # dependent counts: `dlq retry` may revive it, and it must then find its dependency, not run without it.)
    SQL_NEEDED_BY = ("SELECT deps.job_id FROM deps JOIN jobs j ON j.id = deps.job_id JOIN jobs d ON d.id = deps.dep_id "
                     "WHERE deps.dep_id = %s AND j.state <> 'completed' AND d.state <> 'completed'")

    SQL_RESUME_ALL = "DELETE FROM paused"
    SQL_PAUSED = "SELECT queue FROM paused ORDER BY queue"
    SQL_SET_LIMIT = ("INSERT INTO queue_limits (queue, max_running) VALUES (%s, %s) "
                     "ON CONFLICT (queue) DO UPDATE SET max_running = excluded.max_running")
    SQL_REMOVE_LIMIT = "DELETE FROM queue_limits WHERE queue = %s"
    SQL_LIMITS = "SELECT queue, max_running FROM queue_limits ORDER BY queue"
    # What a run that ended must see to: jobs that depend on its job (released or killed with it), and
    # a limit on its queue (it frees a slot: wake the workers). Most jobs have neither, and this one
    # read of two index seeks spares them the update of dependents, which builds a temporary table.
    SQL_RUN_TIES = ("SELECT EXISTS (SELECT 1 FROM deps WHERE dep_id = %s), "
                    "EXISTS (SELECT 1 FROM queue_limits WHERE queue = %s)")

    SQL_REGISTER = ("INSERT INTO workers (id, host, pid, proc_start, boot_id, pid_ns, threads, started_at, "
                    "heartbeat_at, queues, version) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
    SQL_HEARTBEAT = "UPDATE workers SET heartbeat_at = %s, beat = beat + 1 WHERE id = %s"
    SQL_STOP_REQUESTED = "SELECT stop_requested FROM workers WHERE id = %s"
    SQL_DEREGISTER = "DELETE FROM workers WHERE id = %s"
    # Deleting on the registration (id and start time: a worker presumed dead registers again under its
    # id) and the beat we judged makes "dead" a decision no heartbeat can race: a worker that beat
    # meanwhile is not deleted, and one that is deleted can no longer beat or claim.
    SQL_DROP_DEAD_WORKER = "DELETE FROM workers WHERE id = %s AND started_at = %s AND beat = %s"
    SQL_WORKERS = ("SELECT id, host, pid, proc_start, boot_id, pid_ns, heartbeat_at, beat, stop_requested, threads, "
                   "started_at, queues, version FROM workers ORDER BY started_at")
    # Before a migration, the workers of the schema it upgrades (see Store.refuse_older_workers): in the
    # columns every schema has, and the version where the schema records it.
    SQL_OLDER_WORKERS = "SELECT id, host, pid, proc_start, boot_id, pid_ns, heartbeat_at, NULL FROM workers"
    SQL_OLDER_WORKERS_VERSIONED = "SELECT id, host, pid, proc_start, boot_id, pid_ns, heartbeat_at, version FROM workers"

    # Stats over the run history, all in SQL; runs_ended limits each query to the window.
    SQL_STATS_OUTCOMES = "SELECT outcome, count(*) FROM runs WHERE ended_at >= %s GROUP BY outcome"
    # `metrics`: jobs by queue and state.
    SQL_QUEUE_COUNTS = "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state"
    SQL_CONFIG_GET = "SELECT value FROM config WHERE key = %s"
    SQL_CONFIG_SET = ("INSERT INTO config (key, value) VALUES (%s, %s) "
                      "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
    SQL_CONFIG_ALL = "SELECT key, value FROM config"

    # Shell completion (see Store.complete_ids): each reads a bounded stretch of an index, never the table.
    # Ids from a prefix on: the first %s of the id index's range from it (those that start with it come
    # first; the caller keeps only them).
    SQL_COMPLETE_IDS = "SELECT id FROM jobs WHERE id >= %s ORDER BY id LIMIT %s"
    # Dead ids: the dead among the first %s ids from the prefix on (the id index), with the prefix's among
    # the newest %s dead jobs (jobs_state): either alone walks unbounded when the prefix or the dead-letter
    # queue is rare; together each walk has its bound, and a longer prefix narrows the first. The state as a
    # range, ordered by: PostgreSQL's planner, told `state = 'dead' ORDER BY seq DESC`, may walk the primary
    # key back past every newer job to the old dead ones; only jobs_state gives this order.
    SQL_COMPLETE_DEAD_IDS = (
        "SELECT id FROM (SELECT id, state FROM jobs WHERE id >= %s ORDER BY id LIMIT %s) AS from_prefix "
        "WHERE state = 'dead' UNION "
        "SELECT id FROM (SELECT id FROM jobs WHERE state >= 'dead' AND state <= 'dead' "
        "ORDER BY state DESC, seq DESC LIMIT %s) AS newest_dead WHERE id >= %s")
    SQL_COMPLETE_SCHEDULES = "SELECT id FROM schedules WHERE id >= %s ORDER BY id LIMIT %s"

    SQL_INSERT_SCHEDULE = (f"INSERT INTO schedules ({Schedule.COLUMNS}) "
                           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
    # Each schedule with the state of the job its last slot made (NULL once that job is deleted).
    SQL_SCHEDULES = (f"SELECT {Schedule.COLUMNS}, (SELECT state FROM jobs WHERE jobs.id = last_job_id) "
                     "FROM schedules {where} ORDER BY id")
    # A slot's job: another worker may have made it already, and then this one is not made again.
    SQL_INSERT_SLOT_JOB = SQL_INSERT_JOB + " ON CONFLICT (id) DO NOTHING"
    # Moved only from the slot it was read at, so a slot is never passed twice.
    SQL_SCHEDULE_FIRED = ("UPDATE schedules SET next_run_at = %s, last_run_at = coalesce(%s, last_run_at), "
                          "last_job_id = coalesce(%s, last_job_id) WHERE id = %s AND next_run_at = %s")
    SQL_PAUSE_SCHEDULE = "UPDATE schedules SET paused = 1 WHERE id = %s"
    SQL_RESUME_SCHEDULE = "UPDATE schedules SET paused = 0, next_run_at = %s WHERE id = %s"
    SQL_REMOVE_SCHEDULE = "DELETE FROM schedules WHERE id = %s"
    SQL_UPDATE_SCHEDULE = ("UPDATE schedules SET cron = %s, every_s = %s, tz = %s, overlap = %s, job = %s, "
                           "next_run_at = %s WHERE id = %s")


@with_shared(sqlite_marks)
class SqliteSQL:
    """The SQLite statements the store runs that are not SharedSQL's, each complete where it is
    defined. The PostgreSQL dialect has its own."""
    PARAM = "?"  # the parameter mark, for clauses the rules build (see _where)

    SQL_INSERT_DEP = "INSERT OR IGNORE INTO deps (job_id, dep_id) VALUES (?, ?)"
    SQL_JOB_STATE = "SELECT state FROM jobs WHERE id = ?"
    SQL_LIST_JOBS = f"SELECT {Job.COLUMNS} FROM (SELECT * FROM jobs {{where}} ORDER BY seq DESC LIMIT ?) ORDER BY seq"
    SQL_DEPS_OF = "SELECT dep_id FROM deps WHERE job_id = ? ORDER BY rowid"
    # The claim. A waiting job (pending or failed, no unfinished dependency) is *staged* until it is
    # due and *ready* from then on: the claim transaction first promotes the staged jobs that have
    # fallen due (a range of jobs_staged, empty most of the time), so jobs_claim holds only due jobs.
    # Only the promotion sets ready = 1; every update that makes a job wait again sets ready = 0.
    # jobs_claim leads with the queue, and the claim takes the head of each queue it may serve, then
    # the best of those heads: a paused queue, a queue this worker does not serve, or jobs scheduled
    # for later cost nothing however many jobs they hold (a plain priority-ordered index would have
    # to walk past all of them on every claim and poll).
    # Ready is state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1, the WHERE of jobs_claim;
    # staged is the same with ready = 0, jobs_staged's. A statement that names one of them (INDEXED BY)
    # writes its WHERE in full: SQLite uses a partial index only where the statement's WHERE implies it.
    SQL_PROMOTE = ("UPDATE jobs SET ready = 1 WHERE seq IN (SELECT seq FROM jobs INDEXED BY jobs_staged "
                   "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= ?)")
    # A worker whose registration was removed (presumed dead) cannot claim: its jobs would be orphans.
    SQL_REGISTERED = "SELECT 1 FROM workers WHERE id = ?"
    # Is a notification job ready (see Store._wake_for_notices)?
    SQL_ANY_NOTICE = ("SELECT 1 FROM jobs INDEXED BY jobs_notices "
                      "WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 "
                      "LIMIT 1")
    # The claim's choice: the id of the job a claim would take, the best of the heads of the queues it
    # may serve. The poller asks it (see SqliteStore.due_now), and without RETURNING (SQLite < 3.35)
    # the claim runs it, then SQL_CLAIM_ID, in one transaction. Parameters :now and :queues, a JSON
    # array of names (`worker start --queue`), or NULL for every queue: only then does the skip-scan
    # run (json_each yields no row for NULL). The due check only matters when clocks disagree (a job
    # enqueued by a host whose clock runs ahead).
    # A queue is full when it has as many processing jobs as its limit (`queuectl limit`): BEGIN
    # IMMEDIATE makes every claim see every other's, so the count is exact; a full queue, like a
    # paused one, costs one index seek and a count of at most its limit, whatever its backlog.
    # A notification job (see migration 6) is held back by neither: a paused or full queue's head is
    # its best notification, from jobs_notices (an index nearly always empty); an open queue's head is
    # its best job of any kind, so the exemption costs the claims of open queues nothing.
    # Written for SQLite's cost of a run (it runs in every claim and poll): the pause checks as
    # equalities and the heads joined, not `IN (name, '*')` nor `seq IN (heads)`, for which it builds a
    # temporary index at each run (figures in DECISIONS.md).
    SQL_NEXT_DUE = """
    WITH RECURSIVE q(name) AS (  -- every queue with a ready job: one index seek per queue (a skip-scan)
        SELECT (SELECT queue FROM jobs INDEXED BY jobs_claim
                WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 ORDER BY queue LIMIT 1)
        WHERE :queues IS NULL
        UNION ALL
        SELECT (SELECT queue FROM jobs INDEXED BY jobs_claim
                WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 AND queue > q.name
                ORDER BY queue LIMIT 1)
        FROM q WHERE q.name IS NOT NULL),
    served(name) AS (SELECT name FROM q UNION ALL SELECT value FROM json_each(:queues)),
    heads(seq) AS (  -- the best ready job of each such queue neither paused nor full, else its best notification
        SELECT CASE WHEN (NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue = served.name)
                          AND NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue = '*')
                          OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || served.name))  -- resumed alone
                     AND NOT EXISTS (SELECT 1 FROM queue_limits AS l WHERE l.queue = served.name  -- full: at its limit
                                     AND l.max_running <= (SELECT count(*) FROM jobs INDEXED BY jobs_running
                                                           WHERE state = 'processing' AND queue = served.name))
               THEN (SELECT seq FROM jobs INDEXED BY jobs_claim
                     WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 AND queue = served.name
                     AND next_run_at <= :now ORDER BY priority DESC, next_run_at, seq LIMIT 1)
               ELSE (SELECT seq FROM jobs INDEXED BY jobs_notices
                     WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
                     AND queue = served.name AND next_run_at <= :now ORDER BY priority DESC, next_run_at, seq LIMIT 1)
               END
        FROM served
        WHERE served.name IS NOT NULL)
    SELECT jobs.id FROM heads JOIN jobs ON jobs.seq = heads.seq
    ORDER BY jobs.priority DESC, jobs.next_run_at, jobs.seq LIMIT 1"""
    # The claim, one statement: the update of the job SQL_NEXT_DUE chooses, composed from that whole
    # statement so the two cannot disagree (parameters :worker, and SQL_NEXT_DUE's :now and :queues).
    SQL_CLAIM = f"""
    UPDATE jobs SET state = 'processing', worker_id = :worker, run_count = run_count + 1, updated_at = :now
    WHERE id = ({SQL_NEXT_DUE})
      AND EXISTS (SELECT 1 FROM workers WHERE id = :worker)
    RETURNING id, command, state, attempts, max_retries, timeout_s, cwd, env, created_at, updated_at, next_run_at,
              last_error, exit_code, worker_id, run_count, lost_count, priority, queue, waiting_on, on_dead"""
    SQL_CLAIM_ID = ("UPDATE jobs SET state = 'processing', worker_id = ?, run_count = run_count + 1, updated_at = ? "
                    "WHERE id = ? AND state IN ('pending', 'failed')")
    # The poller: a job the claim would take now (SQL_NEXT_DUE), or a staged job that has fallen due
    # anywhere (a claim promotes it; each job can cause at most one such wake-up).
    SQL_ANY_STAGED = ("SELECT 1 FROM jobs INDEXED BY jobs_staged "
                      "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= :now "
                      "LIMIT 1")
    # When the poller looks next: the earliest staged job not due yet (min() reads one end of a range).
    SQL_NEXT_STAGED = ("SELECT min(next_run_at) FROM jobs INDEXED BY jobs_staged "
                       "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at > ?")
    # The workers to wake after a commit (see SqliteStore._wake_workers): those on this host.
    SQL_HOST_WORKERS = "SELECT id FROM workers WHERE host = ?"
    # --burst: is anything processing in our queues, or due within the horizon in one of them (one the
    # claim would take by then, SQL_NEXT_DUE, or a staged one in a queue that is not paused, or a
    # notification job's, which no pause holds back)?
    SQL_ANY_PROCESSING_FROM_QUEUES = ("SELECT 1 FROM jobs WHERE state = 'processing' "
                                      "AND queue IN (SELECT value FROM json_each(:queues)) LIMIT 1")
    SQL_STAGED_SOON_ANY_QUEUE = (
        "SELECT 1 FROM jobs INDEXED BY jobs_staged "
        "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= :now "
        "AND (notifies IS NOT NULL OR NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (jobs.queue, '*')) "
        "OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || jobs.queue)) LIMIT 1")
    SQL_STAGED_SOON_FROM_QUEUES = (
        "SELECT 1 FROM jobs INDEXED BY jobs_staged "
        "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= :now "
        "AND queue IN (SELECT value FROM json_each(:queues)) "
        "AND (notifies IS NOT NULL OR NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (jobs.queue, '*')) "
        "OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || jobs.queue)) LIMIT 1")
    # due_at: when the job became eligible (eligible_at), which the run's wait is counted from.
    # PostgreSQL's claim opens the run in its own statement (`opened` in PostgresSQL.SQL_CLAIM), which
    # restates this one: a change to one is made to the other.
    SQL_INSERT_RUN = "INSERT INTO runs (job_id, run_no, worker_id, started_at, due_at) VALUES (?, ?, ?, ?, ?)"
    # A cancel names the run it was aimed at (cancel_requested holds its run number, 0 = none): a
    # later run of the same job, after `dlq retry`, is never taken for the canceled one.
    SQL_CANCEL_FLAG = ("SELECT cancel_requested = run_count FROM jobs "
                       "WHERE id = ? AND state = 'processing' AND worker_id = ? AND run_count = ?")
    # A run's end is its start plus the duration its worker measured on the monotonic clock, so a
    # wall-clock step while it ran cannot make it negative; a run whose duration nobody measured (a
    # lost worker's) ends at the recorder's wall time, never before it started.
    SQL_FINISH_RUN = ("UPDATE runs SET ended_at = coalesce(started_at + ?, max(?, started_at)), outcome = ?, "
                      "exit_code = ?, error = ?, output = coalesce(?, output), output_bytes = max(output_bytes, ?) "
                      "WHERE job_id = ? AND run_no = ?")
    SQL_RELEASE_DEPENDENTS = ("UPDATE jobs SET waiting_on = waiting_on - 1, next_run_at = max(next_run_at, ?), "
                              "updated_at = ? WHERE id IN (SELECT job_id FROM deps WHERE dep_id = ?) "
                              "AND waiting_on > 0")
    SQL_ADOPT = ("UPDATE jobs SET worker_id = ?1 WHERE id = ?2 AND run_count = ?3 AND state = 'processing' "
                 "AND worker_id = ?4 AND EXISTS (SELECT 1 FROM workers WHERE id = ?1) "
                 "AND NOT EXISTS (SELECT 1 FROM workers WHERE id = ?4)")
    SQL_RUN = ("SELECT run_no, output, output_bytes, ended_at FROM runs WHERE job_id = ? AND (run_no = ? OR ? IS NULL) "
               "ORDER BY run_no DESC LIMIT 1")
    SQL_DEAD_DEPS = ("SELECT deps.dep_id FROM deps JOIN jobs d ON d.id = deps.dep_id "
                     "WHERE deps.job_id = ? AND d.state = 'dead'")
    # Before jobs are deleted, their finished runs are added to the tally of forgotten runs (SQL_RUN_TOTALS):
    # one statement for all the jobs a delete or a purge slice removes (a JSON array of ids). A statement
    # per job would rewrite the row once a job, and on PostgreSQL each rewrite leaves a row version for
    # the next to pass.
    SQL_FORGET_RUNS = (
        "INSERT INTO config (key, value) SELECT 'runs_forgotten', json_array(count(*), "
        "sum(CAST(round((ended_at - started_at) * 1000000) AS INTEGER))) FROM runs "
        "WHERE job_id IN (SELECT value FROM json_each(?)) AND outcome IN ('completed', 'failed', 'dead') "
        "HAVING count(*) > 0 "
        "ON CONFLICT (key) DO UPDATE SET value = json_array(json_extract(value, '$[0]') + "
        "json_extract(excluded.value, '$[0]'), json_extract(value, '$[1]') + json_extract(excluded.value, '$[1]'))")
    # Edges in both directions go: a later job reusing the id must not inherit them.
    SQL_DELETE_JOB = ["DELETE FROM runs WHERE job_id = ?", "DELETE FROM deps WHERE job_id = ?1 OR dep_id = ?1",
                      "DELETE FROM jobs WHERE id = ?"]
    SQL_PURGE_IDS = ("SELECT id FROM jobs WHERE state = ? AND updated_at < ? AND (state = 'completed' OR NOT EXISTS "
                     "(SELECT 1 FROM deps JOIN jobs j ON j.id = deps.job_id WHERE deps.dep_id = jobs.id "
                     "AND j.state <> 'completed')) LIMIT ?")
    # Paused queues: a row per queue, or '*' (every queue) with a row '!name' per queue resumed alone.
    SQL_PAUSE_ALL = ["DELETE FROM paused", "INSERT INTO paused (queue) VALUES ('*')"]
    SQL_PAUSE = ["DELETE FROM paused WHERE queue = '!' || ?",
                 "INSERT OR IGNORE INTO paused (queue) SELECT ? "
                 "WHERE NOT EXISTS (SELECT 1 FROM paused WHERE queue = '*')"]
    SQL_RESUME = ["DELETE FROM paused WHERE queue = ?",
                  "INSERT OR IGNORE INTO paused (queue) SELECT '!' || ? "
                  "WHERE EXISTS (SELECT 1 FROM paused WHERE queue = '*')"]
    SQL_LOCK_PAUSED = None  # BEGIN IMMEDIATE already orders pauses, resumes and claims (see PostgresSQL's)
    SQL_LOCK_LIMITS = None  # BEGIN IMMEDIATE already orders a limit after every claim (see PostgresSQL's)
    SQL_REQUEST_STOP = "UPDATE workers SET stop_requested = 1 WHERE id = ?"
    # The window's durations and waits, read in one pass and sorted in Python: SQLite would sort the
    # window once per percentile query, Python sorts a list of floats once (DECISIONS.md: "Stats").
    SQL_STATS_TIMES = ("SELECT ended_at - started_at, max(0, started_at - due_at) FROM runs "
                       "WHERE ended_at >= ? AND outcome IN ('completed', 'failed', 'dead')")
    # `metrics`' run_duration _count and _sum: the finished runs kept, plus those deleted with their jobs
    # (the tally SQL_FORGET_RUNS keeps in `config`, a key no setting has), so neither ever goes down.
    # Durations are summed in whole microseconds: integers add up the same in either place.
    SQL_RUN_TOTALS = ("SELECT count(*), coalesce(sum(CAST(round((ended_at - started_at) * 1000000) AS INTEGER)), 0), "
                      "(SELECT value FROM config WHERE key = 'runs_forgotten') FROM runs "
                      "WHERE outcome IN ('completed', 'failed', 'dead')")
    # `metrics`: the oldest eligible job (ready or staged, due, not paused) of each queue, of which
    # `stats` takes the least, by when it became eligible (see eligible_at).
    SQL_OLDEST_ELIGIBLE_BY_QUEUE = (
        "SELECT e.queue, min(e.eligible_at) FROM (SELECT queue, max(next_run_at, created_at) AS eligible_at "
        "FROM jobs INDEXED BY jobs_claim WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 "
        "AND next_run_at <= ?1 UNION ALL "
        "SELECT queue, max(next_run_at, created_at) FROM jobs INDEXED BY jobs_staged "
        "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= ?1) AS e "
        "WHERE (NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (e.queue, '*')) "
        "OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || e.queue)) GROUP BY e.queue")
    SQL_IDENTITY = ("SELECT (SELECT application_id FROM pragma_application_id()), "
                    "(SELECT count(*) FROM sqlite_master), (SELECT user_version FROM pragma_user_version())")
    SQL_VERSION = "SELECT user_version FROM pragma_user_version()"

    # Finished runs per minute since a start time, for the dashboard's chart (runs_ended serves the
    # range). ended_at - start is never negative here, so CAST truncates like floor() (a PostgreSQL
    # class would write floor(), as CAST rounds there).
    SQL_RUNS_PER_MINUTE = ("SELECT CAST((ended_at - ?) / 60 AS INTEGER) AS minute, outcome, count(*) FROM runs "
                           "WHERE ended_at >= ? AND outcome IN ('completed', 'failed', 'dead') "
                           "GROUP BY minute, outcome")
    SQL_QUERY_ONLY = "PRAGMA query_only = ON"

    # Shell completion's queue names: of waiting jobs (one probe of jobs_claim a queue: a loose index scan),
    # of processing jobs (jobs_running), of the newest ? jobs (the primary key), and those paused or limited.
    SQL_COMPLETE_QUEUES = """
        WITH RECURSIVE waiting(queue) AS (
            SELECT min(queue) FROM jobs INDEXED BY jobs_claim
                WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
            UNION ALL SELECT (SELECT min(queue) FROM jobs INDEXED BY jobs_claim WHERE queue > waiting.queue
                AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1)
            FROM waiting WHERE waiting.queue IS NOT NULL)
        SELECT queue FROM waiting WHERE queue IS NOT NULL
        UNION SELECT queue FROM (SELECT queue FROM jobs ORDER BY seq DESC LIMIT ?) AS newest
        UNION SELECT queue FROM jobs INDEXED BY jobs_running WHERE state = 'processing'
        UNION SELECT queue FROM queue_limits UNION SELECT queue FROM paused"""

    # Schedules. The earliest slot to fire, by schedules_due (min() reads one end of the index).
    SQL_NEXT_SCHEDULE = "SELECT min(next_run_at) FROM schedules INDEXED BY schedules_due WHERE paused = 0"
    SQL_DUE_SCHEDULES = (f"SELECT {Schedule.COLUMNS}, (SELECT state FROM jobs WHERE jobs.id = last_job_id) "
                         "FROM schedules INDEXED BY schedules_due WHERE paused = 0 AND next_run_at <= ? "
                         "ORDER BY next_run_at")
    SQL_SCHEDULE_TO_CHANGE = f"SELECT {Schedule.COLUMNS}, NULL FROM schedules WHERE id = ?"
    # The greatest id below :below that is :prefix (a schedule's id and '@') then a slot's shape: a range
    # of the id index (every id from 'ID@' up to 'ID@:' starts with 'ID@'), then GLOB on the rest. Slot
    # times have a fixed width, so the greatest such id is the latest slot's.
    SQL_NEWEST_SLOT_JOB = ("SELECT max(id) FROM jobs WHERE id > :prefix AND id < :below "
                           "AND substr(id, length(:prefix) + 1) "
                           "GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]Z'")

    @staticmethod
    def id_array(ids: list[str]) -> str:
        """Job ids as SQL_FORGET_RUNS takes them: a JSON array."""
        return json.dumps(ids)


HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)
Cursor = sqlite3.Cursor  # what a Store's rules are given: a DB-API cursor (execute, fetchone, fetchall, rowcount)


def _where_in_batch(spec: dict) -> str:
    """'line 3: ' for a job read by `enqueue -`, '' for a single job."""
    return f"{spec['where']}: " if spec.get("where") else ""


def _where(mark: str, **equal) -> tuple[str, tuple]:
    """A WHERE clause of `column = mark` terms for the given non-None values (mark: the dialect's PARAM)."""
    terms = {k: v for k, v in equal.items() if v is not None}
    return ("WHERE " + " AND ".join(f"{k} = {mark}" for k in terms) if terms else ""), tuple(terms.values())


def _and_queue(mark: str, queue: str | None) -> tuple[str, tuple]:
    """`AND queue = mark` and its parameter, or nothing for every queue (mark: the dialect's PARAM)."""
    return (f"AND queue = {mark}", (queue,)) if queue is not None else ("", ())


_PROCESS_LOCKS: dict = {}


def _finished(job: Job, state: str, attempts: int, next_run_at: float, outcome: Outcome, now: float) -> Job:
    """The job as a recorded result leaves it (a copy of its fields, not a call of Job's __init__ with
    them as keywords: twice the cost, on every job's path)."""
    after = Job.__new__(Job)
    after.__dict__ = {**job.__dict__, "state": state, "attempts": attempts, "next_run_at": next_run_at,
                      "last_error": outcome.error, "exit_code": outcome.exit_code, "worker_id": None, "updated_at": now}
    return after


def _process_lock(path: str):
    """One lock per database file per process, shared by every Store (thread) that writes it.
    Re-entrant: a Store shared by threads also takes it to read (see SqliteStore.shared)."""
    import threading
    return _PROCESS_LOCKS.setdefault(os.path.realpath(path), threading.RLock())


def _create_private(path: str) -> None:
    """Create the database file 0600 before SQLite does (it gives -wal and -shm the same mode).

    Only when it is missing: closing *any* descriptor of an open SQLite file drops every POSIX
    lock this process holds on it, so reopening an existing file here would silently unlock the
    other connections of a worker process and let two of them write at once.
    """
    # The real path: a dangling symlink's target is created here, not by SQLite with the umask's mode
    # (an O_EXCL open of the link itself fails: the link exists).
    real = os.path.realpath(path)
    if os.path.exists(real):
        return
    try:
        fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)  # a umask such as 0277 took the owner's write bit: SQLite could not write it
    finally:
        os.close(fd)


def _make_private(path: str) -> None:
    """0600 for a file that became a queuectl database (say an empty file a user made with 0644) and its
    -wal and -shm: it holds commands, environments and output. chmod opens no descriptor (see above)."""
    for name in (path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(OSError):  # gone, or not ours to change: leave it
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)


def _errno_text(code: int) -> str:
    """The OS's words for an errno, as a message continues them: 'is a directory'."""
    text = os.strerror(code)
    return text[:1].lower() + text[1:]


def _companions(path: str) -> tuple[str, str]:
    """The -wal and -shm files SQLite keeps beside a database in WAL mode."""
    return f"{path}-wal", f"{path}-shm"


def _writable_or_creatable(name: str) -> bool:
    if os.path.exists(name):
        return os.access(name, os.W_OK)
    return os.access(os.path.dirname(name) or ".", os.W_OK | os.X_OK)


def _writable(path: str) -> bool:
    """Whether this user can write the database as SQLite must: the file, and its -wal and -shm (or
    the folder, to create them). Root passes unless the file system is read-only."""
    return os.access(path, os.W_OK) and all(_writable_or_creatable(name) for name in _companions(path))


def _cannot_write(name: str) -> str:
    """Why the OS refuses to write `name` (or to create it in its folder)."""
    import errno
    target = name if os.path.exists(name) else os.path.dirname(name) or "."
    with contextlib.suppress(OSError):
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return _errno_text(errno.EROFS)
    return _errno_text(errno.EACCES)


def _access_problem(path: str, write: bool) -> str | None:
    """What keeps this user from reading (and, if `write`, writing) the database, in the OS's words;
    found with stat and access alone (opening a descriptor could drop this process's SQLite locks)."""
    import errno
    if os.path.isdir(path):
        return f"cannot open {path}: {_errno_text(errno.EISDIR)}"
    if not os.path.exists(path):
        return None
    for name in (path, *_companions(path)):
        if os.path.exists(name) and not os.access(name, os.R_OK):
            return f"cannot open {name}: {_errno_text(errno.EACCES)}"
    if not write:
        return None
    if not os.access(path, os.W_OK):
        return f"cannot write {path}: {_cannot_write(path)}"
    for name in _companions(path):
        if not _writable_or_creatable(name):
            return f"cannot {'write' if os.path.exists(name) else 'create'} {name}: {_cannot_write(name)}"
    return None


class _Raced(Exception):
    """A read-only open met a writer appearing or leaving: try again."""


# SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_CANTOPEN: what a read-only open that raced a writer sees
RACED_READ_ERRORS = (8, 11, 14)


def _signature(path: str) -> tuple:
    """What changes when a writer opens or writes a database: its -wal appearing, its size, mtime, inode."""
    try:
        st = os.stat(path)
    except OSError:
        return (None,)
    return (os.path.exists(f"{path}-wal"), st.st_ino, st.st_size, st.st_mtime_ns)


def _file_id(path: str) -> tuple | None:
    """(st_dev, st_ino) of the file `path` names now, None if it leads to none (any error: a folder on the way
    replaced by a file, or made unreadable, is a path commands cannot use either)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _check_regular(path: str, real: str) -> None:
    """Refuse what is not a regular file before SQLite opens it (a FIFO would block the open)."""
    import stat
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return  # missing (created later) or unreadable: the open reports it
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise BadDatabase(f"cannot open {path}: not a regular file")


def database_error(path: str, error: sqlite3.Error, *, opening: bool, write: bool = True) -> BadDatabase:
    """An SQLite error as one line that names the file and, when the OS is the cause, its reason."""
    problem = _access_problem(os.path.realpath(path), write)
    if problem:
        return BadDatabase(problem)
    with contextlib.suppress(OSError):
        if os.statvfs(os.path.dirname(os.path.realpath(path)) or ".").f_bavail == 0:
            return BadDatabase(f"cannot write {path}: {_errno_text(28)}")  # ENOSPC
    return BadDatabase(f"{'cannot open' if opening else 'database'} {path}: {error}")


def _owner(path: str) -> str:
    """The user name (or uid) that owns a file."""
    import pwd
    uid = os.stat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class Store:
    """The queue's rules over SQL, written once: every read and write of the queue goes through a Store.

    A dialect's subclass (SqliteStore, PostgresStore) opens the connection and provides `sql`, its
    complete statements; `IntegrityError`, its driver's; `path`, the database's name for messages;
    `target`, what open_database() opens it again by; `write(fn)`, fn(cursor) in one transaction;
    `read(sql, params)`; `now()`; `_claim_in(cursor, …)`; `flush_output`; `due_now`; `burst_done`;
    `close`; `query_only`; `refresh`; `_wake_workers(cursor)`, called inside each transaction that
    makes a job due, now or at a later time (the workers then sleep until it); and, where `notifies`
    is true, `wait_notified(timeout_s)`.
    """
    sql: type
    IntegrityError: type
    notifies = False  # does a worker LISTEN for _wake_workers()? (else it hears them on a socket: see Wake-ups)
    cut_off_kills = False  # must a worker that cannot heartbeat kill its runs (see Worker.cut_off)?
    shared_by_hosts = False  # may a lost run be rerun on another host (so jobs die with their worker)?
    one_writer = False  # are a process's writes taken in turns, so its runners may share one connection?
    committed = False  # has a write of this Store been committed? (a command whose output fails says so)

    # -- jobs -----------------------------------------------------------------------------------

    def enqueue(self, specs: list[dict], now: float, stored: Callable[[int], None] = lambda count: None) -> list[str]:
        """Insert validated job specs in one transaction, all or nothing; returns their ids. `stored(count)`
        hears how many are inserted so far (not committed yet), for a progress line."""
        def insert(cur):
            plain: list[dict] = []
            # A job due later wakes them too: each worker then sleeps until the earliest due time.
            wake = False
            for count, spec in enumerate(specs, start=1):
                if spec["depends_on"]:
                    self._insert_plain(cur, plain, now)
                    wake |= self._insert_with_deps(cur, spec, now)
                    stored(count)
                else:
                    plain.append(spec)
                    wake = True
                    if len(plain) == INSERT_SLICE:
                        self._insert_plain(cur, plain, now)
                        stored(count)
            self._insert_plain(cur, plain, now)
            stored(len(specs))
            if wake:
                self._wake_workers(cur)
            return [spec["id"] for spec in specs]
        return self._write_jobs(insert, specs)

    def _write_jobs(self, insert, specs: list[dict]) -> list[str]:
        """write(insert): the transaction of enqueue()."""
        return self.write(insert)

    def enqueue_streamed(self, specs: Iterator[dict], now: float, check: Callable[[list[dict]], None],
                         stored: Callable[[int], None]) -> list[dict] | None:
        """Store a big batch while its jobs are still being validated, where that is faster; None where it
        is not or could not be done (nothing stored): the caller then validates again and calls enqueue().
        Here, never: on SQLite the inserts need the same core the validation does."""
        return None

    def _row(self, spec: dict, waiting_on: int, now: float) -> tuple:
        due = spec["run_at"] or now
        ready = not waiting_on and due <= now  # else staged: see self.sql.SQL_PROMOTE
        return (spec["id"], spec["command"], PENDING, spec["max_retries"], spec["timeout"], spec["cwd"],
                json.dumps(spec["env"]) if spec["env"] else "{}", now, now, due, spec["priority"], spec["queue"],
                waiting_on, None, int(ready), spec.get("on_dead"))

    def _insert_plain(self, cur: Cursor, specs: list[dict], now: float) -> None:
        """executemany the buffered jobs without dependencies (the fast path of a batch)."""
        cur.execute("SAVEPOINT batch")
        try:
            self._insert_rows(cur, [self._row(spec, 0, now) for spec in specs])
        except self.IntegrityError:
            # Undo the rows this call inserted, so the first id found taken is really someone else's.
            cur.execute("ROLLBACK TO batch")
            taken = self._first_taken(cur, specs)
            raise Conflict(f"{_where_in_batch(taken)}job {taken['id']!r} already exists") from None
        cur.execute("RELEASE batch")
        specs.clear()

    def _insert_rows(self, cur: Cursor, rows: list[tuple]) -> None:
        """Insert job rows made by _row(); IntegrityError if an id is taken."""
        cur.executemany(self.sql.SQL_INSERT_JOB, rows)

    def _first_taken(self, cur: Cursor, specs: list[dict]) -> dict:
        """The first of these specs whose id another job has."""
        return next(spec for spec in specs if cur.execute(self.sql.SQL_JOB_STATE, (spec["id"],)).fetchone())

    def _insert_with_deps(self, cur: Cursor, spec: dict, now: float) -> bool:
        """Insert one job with dependencies; returns whether it waits on none (all of them completed)."""
        states = {}
        for dep in spec["depends_on"]:
            row = cur.execute(self.sql.SQL_JOB_STATE, (dep,)).fetchone()
            if row is None:
                raise NotFound(f"{_where_in_batch(spec)}job {spec['id']!r} depends on {dep!r}, which does not exist")
            states[dep] = row[0]
        # A job on a dead dependency could only go to the DLQ at once; refused, as `dlq retry` refuses
        # to revive a dependent alone: retry the dependency first.
        dead = next((d for d, s in states.items() if s == DEAD), None)
        if dead is not None:
            raise Conflict(f"{_where_in_batch(spec)}job {spec['id']!r} depends on {dead!r}, which is dead "
                           "(dlq retry it first)")
        waiting = sum(1 for s in states.values() if s != COMPLETED)
        try:
            cur.execute(self.sql.SQL_INSERT_JOB, self._row(spec, waiting, now))
        except self.IntegrityError:
            raise Conflict(f"{_where_in_batch(spec)}job {spec['id']!r} already exists") from None
        cur.executemany(self.sql.SQL_INSERT_DEP, [(spec["id"], dep) for dep in spec["depends_on"]])
        return not waiting

    def get(self, job_id: str) -> Job:
        """One job; NotFound if absent."""
        rows = self.read(self.sql.SQL_GET_JOB, (job_id,))
        if not rows:
            raise NotFound(f"no job with id {job_id!r}")
        return Job.from_row(rows[0])

    def depends_on(self, job_id: str) -> list[str]:
        """Ids the job depends on, in the order given."""
        return [r[0] for r in self.read(self.sql.SQL_DEPS_OF, (job_id,))]

    def list_jobs(self, state: str | None = None, limit: int = -1, queue: str | None = None) -> list[Job]:
        """Jobs oldest first; with a limit, the newest `limit` of them."""
        where, params = _where(self.sql.PARAM, state=state, queue=queue)
        return [Job.from_row(r) for r in self.read(self.sql.SQL_LIST_JOBS.format(where=where), params + (limit,))]

    def page_jobs(self, state: str | None = None, queue: str | None = None, limit: int = 50,
                  offset: int = 0) -> list[Job]:
        """Jobs newest first: `limit` of them after skipping the `offset` newest."""
        where, params = _where(self.sql.PARAM, state=state, queue=queue)
        rows = self.read(self.sql.SQL_PAGE_JOBS.format(where=where), params + (limit, offset))
        return [Job.from_row(r) for r in rows]

    # -- shell completion: bounded reads of an index (the SQL_COMPLETE_* statements) -----------------

    def complete_ids(self, prefix: str, dead: bool = False) -> list[str]:
        """Up to COMPLETE_LIMIT job ids that start with `prefix` (only dead jobs' with `dead`), sorted."""
        rows = (self.read(self.sql.SQL_COMPLETE_DEAD_IDS, (prefix, COMPLETE_WALK, COMPLETE_WALK, prefix)) if dead
                else self.read(self.sql.SQL_COMPLETE_IDS, (prefix, COMPLETE_LIMIT)))
        return sorted(r[0] for r in rows if r[0].startswith(prefix))[:COMPLETE_LIMIT]

    def complete_queues(self) -> list[str]:
        """Queue names a user is likely to type: waiting, running, recent, paused or limited ones."""
        rows = self.read(self.sql.SQL_COMPLETE_QUEUES, (COMPLETE_WALK,))
        return sorted({r[0].removeprefix("!") for r in rows} - {"*"})

    def complete_schedules(self, prefix: str) -> list[str]:
        """Up to COMPLETE_LIMIT schedule ids that start with `prefix`."""
        rows = self.read(self.sql.SQL_COMPLETE_SCHEDULES, (prefix, COMPLETE_LIMIT))
        return [r[0] for r in rows if r[0].startswith(prefix)]

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Number of jobs in each state (all five keys)."""
        where, params = _where(self.sql.PARAM, queue=queue)
        counts = dict.fromkeys(STATES, 0)
        counts.update(self.read(self.sql.SQL_COUNTS.format(where=where), params))
        return counts

    def unfinished(self, queue: str | None) -> tuple[set[int], int]:
        """The seqs of the jobs pending, failed or processing now (of `queue`, or of every queue), and
        the highest seq so far (0 if none), read in one snapshot: what `wait --all` answers for."""
        clause, params = _and_queue(self.sql.PARAM, queue)
        rows = self.read(self.sql.SQL_UNFINISHED_SEQS.format(queue=clause), params)
        # The highest seq even when nothing is unfinished: `wait --all` counts the jobs enqueued after it.
        return {seq for kind, seq in rows if kind}, next(seq for kind, seq in rows if not kind)

    def wait_counts(self, queue: str | None, after_seq: int) -> tuple[int, int]:
        """(jobs pending, failed or processing now, jobs enqueued after seq `after_seq` still here)."""
        clause, params = _and_queue(self.sql.PARAM, queue)
        return tuple(self.read(self.sql.SQL_WAIT_COUNTS.format(queue=clause), params + (after_seq,) + params)[0])

    def dead_between(self, queue: str | None, low_seq: int, high_seq: int) -> list[tuple[str, int]]:
        """(id, seq) of the dead jobs whose seq is from `low_seq` to `high_seq`, in enqueue order."""
        clause, params = _and_queue(self.sql.PARAM, queue)
        return self.read(self.sql.SQL_DEAD_BETWEEN.format(queue=clause), (low_seq, high_seq) + params)

    def runs(self, job_id: str) -> list[dict]:
        """Every run of a job, oldest first."""
        keys = ("run", "worker_id", "started_at", "due_at", "ended_at", "outcome", "exit_code", "error", "output",
                "output_bytes")
        return [dict(zip(keys, r)) for r in self.read(self.sql.SQL_RUNS, (job_id,))]

    def run_end(self, job_id: str, run_no: int) -> dict | None:
        """How run N of a job ended: outcome (None while it runs), exit_code, error; None if there is no run N."""
        rows = self.read(self.sql.SQL_RUN_END, (job_id, run_no))
        return dict(zip(("outcome", "exit_code", "error"), rows[0])) if rows else None

    def dead_output(self, job: Job) -> bytes | None:
        """What a notification job (see migration 6) gets on its stdin: the kept output of the dead job's run
        that QUEUECTL_DEAD_RUN names (b"" if none); None for a job that only looks like a notification."""
        rows = self.read(self.sql.SQL_DEAD_OUTPUT, (job.env.get("QUEUECTL_DEAD_RUN"), job.id))
        return bytes(rows[0][0] or b"") if rows else None

    def run_output(self, job_id: str, run_no: int | None = None) -> tuple | None:
        """(run_no, output tail, total bytes so far, ended_at) of run N or the latest; None if none."""
        self.get(job_id)
        rows = self.read(self.sql.SQL_RUN, (job_id, run_no, run_no))
        return rows[0] if rows else None

    def next_due_at(self, now: float) -> float | None:
        """When the earliest waiting job that is not due at `now` falls due (Unix seconds); None if none."""
        return self.read(self.sql.SQL_NEXT_STAGED, (now,))[0][0]

    def claim(self, worker_id: str, now: float, queues: tuple = (), only: str | None = None) -> Job | None:
        """Atomically take the best due job for this worker and open its run record. `only` (a job id,
        `run --burst`): that job if it is the one the claim takes, else nothing, the claim rolled back; so
        the job waits its turn in its queue, pauses and limits as for any claim."""
        def claim_only(cur):
            job = self._claim_in(cur, worker_id, now, queues)
            if job is not None and only is not None and job.id != only:
                raise _NotItsTurn
            return job
        try:
            return self.write(claim_only)
        except _NotItsTurn:
            return None

    def finish(self, job: Job, worker_id: str, outcome: Outcome, settings: dict, now: float) -> Job | None:
        """Record a run's outcome; None if this worker no longer owns the job (nothing written)."""
        return self.write(lambda cur: self._finish_in(cur, job, worker_id, outcome, settings, now))

    def finish_and_claim(self, job: Job, worker_id: str, outcome: Outcome, settings: dict, now: float,
                         queues: tuple) -> tuple[Job | None, Job | None]:
        """finish() and claim() in one transaction: one commit per job instead of two."""
        def both(cur):
            return (self._finish_in(cur, job, worker_id, outcome, settings, now),
                    self._claim_in(cur, worker_id, now, queues))
        return self.write(both)

    def _finish_in(self, cur: Cursor, job: Job, worker_id: str, outcome: Outcome, settings: dict,
                   now: float) -> Job | None:
        state, attempts, next_run_at = failure_rule(job, outcome, settings, now)
        # (A run that completed stays completed, canceled or not: only a failure asks.)
        flag = state != COMPLETED and \
            cur.execute(self.sql.SQL_CANCEL_FLAG, (job.id, worker_id, job.run_count)).fetchone()
        if flag and flag[0]:
            # Canceled while running, but it failed before its worker got round to killing it:
            # the cancel wins over a retry (a run that completed anyway stays completed).
            state, outcome = DEAD, Outcome(outcome.exit_code, "canceled", outcome.output, outcome.duration_s)
        cur.execute(self.sql.SQL_FINISH_JOB, (state, attempts, next_run_at, outcome.error, outcome.exit_code, now,
                                     job.id, worker_id, job.run_count))
        if cur.rowcount != 1:
            return None
        self._close_run(cur, job, state, outcome, now)
        self._after_run(cur, job, state, now, retry=state == FAILED)
        return _finished(job, state, attempts, next_run_at, outcome, now)

    def _after_run(self, cur: Cursor, job: Job, state: str, now: float, retry: bool) -> None:
        """What a run that ended sets off: its dependents released or killed (see _settle_dependents), and
        a wake-up of the workers if its job runs again (now, or later: they sleep until then), it held
        a slot of a limited queue, whose waiting jobs may run now, or its death made a notification job."""
        dependents, limited = cur.execute(self.sql.SQL_RUN_TIES, (job.id, job.queue)).fetchone()
        if dependents:
            self._settle_dependents(cur, job.id, state, now)
        if retry or limited:
            self._wake_workers(cur)
        elif state == DEAD:  # with or without dependents, a death may have made notification jobs
            self._wake_for_notices(cur)

    def _close_run(self, cur: Cursor, job: Job, label: str, outcome: Outcome, now: float) -> None:
        cur.execute(self.sql.SQL_FINISH_RUN, (outcome.duration_s, now, label, outcome.exit_code, outcome.error,
                                              outcome.output, outcome.output_bytes, job.id, job.run_count))

    def _settle_dependents(self, cur: Cursor, job_id: str, state: str, now: float) -> None:
        """A completed job may make dependents due; a dead one takes them to the DLQ."""
        if state == COMPLETED:
            if cur.execute(self.sql.SQL_RELEASE_DEPENDENTS, (now, now, job_id)).rowcount:
                self._wake_workers(cur)  # maybe one was waiting for this one alone
        elif state == DEAD:
            self._kill_dependents(cur, job_id, now)

    def _wake_for_schedules(self, cur: Cursor) -> None:
        """Called inside each transaction that adds, changes or resumes a schedule. PostgreSQL notifies its
        listening workers, which then look at once and otherwise seldom (see Worker._listen); an SQLite
        worker looks every SCHEDULE_CHECK_S."""

    def _wake_for_notices(self, cur: Cursor) -> None:
        """After a death: wake the workers if a notification job waits to run (this death's, made by the
        trigger of migration 6; one seek in jobs_notices, which is empty when none waits)."""
        if cur.execute(self.sql.SQL_ANY_NOTICE).fetchone():
            self._wake_workers(cur)

    def _kill_dependents(self, cur: Cursor, job_id: str, now: float) -> None:
        """Send every unfinished job below a dead one to the DLQ. Repeated until it finds none: on
        PostgreSQL each statement sees the commits made before it began, and a dependent enqueued on
        the chain while this one waited for a lock is seen only by the next statement. (SQLite has
        one writer, and its driver reports -1 rows for a statement that starts with WITH.)"""
        while cur.execute(self.sql.SQL_KILL_DEPENDENTS, (job_id, now)).rowcount > 0:
            pass

    def interrupt(self, job: Job, worker_id: str, outcome: Outcome, lost: bool, now: float,
                  stuck: str | None = None) -> str | None:
        """End a run the worker interrupted (stop, lost worker, cancel); returns the job's new state.

        Not an attempt: a stopped or lost run goes back to pending (a lost one counts toward the
        poison cap), unless a cancel was asked for, or a leftover process of the run could not be
        killed (`stuck` says which), which send it to the DLQ.
        """
        def requeue(cur):
            flag = cur.execute(self.sql.SQL_CANCEL_FLAG, (job.id, worker_id, job.run_count)).fetchone()
            if flag is None:
                return None
            state, error = interrupt_rule(job.lost_count + lost, lost, bool(flag[0]), stuck,
                                          outcome.error if outcome.interrupted == "canceled" else "canceled")
            cur.execute(self.sql.SQL_REQUEUE, (state, int(lost), error, state, now, now, job.id, worker_id,
                                               job.run_count))
            self._close_run(cur, job, "canceled" if flag[0] else "lost" if lost else "stopped", outcome, now)
            self._after_run(cur, job, state, now, retry=state == PENDING)
            return state
        return self.write(requeue)

    def retry_dead(self, job_ids: list[str], now: float) -> None:
        """Move dead jobs back to pending, all or nothing; a dead dependency must be retried with them."""
        self.write(lambda cur: self._revive(cur, job_ids, now))

    def retry_all_dead(self, queue: str | None, now: float) -> list[str]:
        """`dlq retry --all`: every dead job (of `queue`) and the dead jobs it depends on, in any queue,
        revived in one transaction; returns their ids, oldest first (then any dependency that died meanwhile)."""
        def revive_all(cur):
            todo = [r[0] for r in cur.execute(self.sql.SQL_DEAD_CHAINS, (queue,)).fetchall()]
            ids, seen = [], set()
            # The chain is walked twice, on purpose. SQL_DEAD_CHAINS finds it in one statement, in enqueue
            # order. On PostgreSQL that is a snapshot taken before any of its rows is locked: while this
            # waits for a row's lock, another command may revive or purge a job of it (skipped, not an
            # error), or a dependency may die (taken along: revived without it, the job would wait on a dead
            # dependency). So each job is locked and read again here, and its dead dependencies found
            # again under their locks: SQL_JOB_STATE and SQL_DEAD_DEPS lock what they read, so nothing found
            # here changes before COMMIT. On SQLite, one writer, this walk finds what the first found: kept,
            # so that the rule is written once for both backends.
            for job_id in todo:  # the loop also visits what is appended to `todo` while it runs
                if job_id in seen:
                    continue
                seen.add(job_id)
                row = cur.execute(self.sql.SQL_JOB_STATE, (job_id,)).fetchone()
                if row and row[0] == DEAD:
                    ids.append(job_id)
                    todo += [d for (d,) in cur.execute(self.sql.SQL_DEAD_DEPS, (job_id,))]
            self._requeue_dead(cur, ids, now)
            return ids
        return self.write(revive_all)

    def _revive(self, cur: Cursor, job_ids: list[str], now: float) -> None:
        wanted = set(job_ids)
        for job_id in job_ids:
            row = cur.execute(self.sql.SQL_JOB_STATE, (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job with id {job_id!r}")
            if row[0] != DEAD:
                raise Conflict(f"job {job_id!r} is {row[0]}, not dead")
            blocker = next((d for (d,) in cur.execute(self.sql.SQL_DEAD_DEPS, (job_id,)) if d not in wanted), None)
            if blocker:
                raise Conflict(f"job {job_id!r} depends on dead job {blocker!r}: retry both together")
        self._requeue_dead(cur, job_ids, now)

    def _requeue_dead(self, cur: Cursor, job_ids: list[str], now: float) -> None:
        for job_id in job_ids:  # in the order given; a dependency listed later still counts as unfinished
            cur.execute(self.sql.SQL_RETRY, (now, now, job_id))
        if job_ids:
            self._wake_workers(cur)

    def cancel(self, job_ids: list[str], now: float) -> None:
        """Cancel jobs, all or nothing: waiting ones go to the DLQ now, running ones when their worker kills them."""
        def cancel(cur):
            for job_id in job_ids:
                state = self._state_in(cur, job_id)
                if state in (COMPLETED, DEAD):
                    raise Conflict(f"job {job_id!r} is already {state}")
            self._cancel_in(cur, job_ids, now)
        self.write(cancel)

    def cancel_all(self, queue: str | None, now: float) -> list[str]:
        """`cancel --all`: cancel every job (of `queue`) that has not finished, in one transaction, as
        cancel() does; returns the ids canceled, oldest first (one that finished meanwhile is left alone)."""
        return self.write(lambda cur: self._cancel_in(
            cur, [r[0] for r in cur.execute(self.sql.SQL_UNFINISHED, (queue,)).fetchall()], now))

    def _cancel_in(self, cur: Cursor, job_ids: list[str], now: float) -> list[str]:
        """Cancel each job that has not finished; returns those canceled, in the order given."""
        waiting, running = [], []
        for job_id in job_ids:
            # Read under the row's lock (PostgreSQL): a run that ends between an UPDATE for waiting jobs
            # and one for running jobs would leave its job failed and uncanceled.
            row = cur.execute(self.sql.SQL_JOB_STATE, (job_id,)).fetchone()
            if row and row[0] in (PENDING, FAILED):
                cur.execute(self.sql.SQL_CANCEL_WAITING, (now, job_id))
                waiting.append(job_id)
            elif row and row[0] == PROCESSING:
                cur.execute(self.sql.SQL_CANCEL_RUNNING, (job_id,))
                running.append(job_id)
        # Only after every cancel: a dependent that is canceled too says 'canceled', not 'dependency x is dead'.
        for job_id in waiting:
            self._kill_dependents(cur, job_id, now)
        if waiting:
            self._wake_for_notices(cur)
        done = {*waiting, *running}
        return [i for i in job_ids if i in done]

    def _state_in(self, cur: Cursor, job_id: str) -> str:
        row = cur.execute(self.sql.SQL_JOB_STATE, (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job with id {job_id!r}")
        return row[0]

    def delete(self, job_ids: list[str]) -> None:
        """Remove jobs and their runs, all or nothing; never a processing job or one still needed."""
        def delete(cur):
            for job_id in job_ids:
                if self._state_in(cur, job_id) == PROCESSING:
                    raise Conflict(f"job {job_id!r} is processing; cancel it first")
                needed = [d for (d,) in cur.execute(self.sql.SQL_NEEDED_BY, (job_id,)) if d not in job_ids]
                if needed:
                    raise Conflict(f"job {job_id!r} is needed by job(s) not completed: {', '.join(needed)} "
                                   "(delete them too, or first)")
            # After the checks above, which on PostgreSQL lock each job: the tally's row is locked last,
            # as a purge slice does, so the two cannot wait on each other in a cycle.
            cur.execute(self.sql.SQL_FORGET_RUNS, (self.sql.id_array(job_ids),))
            for job_id in job_ids:
                for sql in self.sql.SQL_DELETE_JOB:
                    cur.execute(sql, (job_id,))
        self.write(delete)

    def purge(self, state: str, before: float, limit: int = -1) -> int:
        """Remove finished jobs in `state` last updated before `before`, with their runs; returns how many.
        A dead job that a job not completed depends on stays until that job is gone (see self.sql.SQL_NEEDED_BY)."""
        def purge(cur):
            ids = [r[0] for r in cur.execute(self.sql.SQL_PURGE_IDS, (state, before, limit))]
            if ids:
                cur.execute(self.sql.SQL_FORGET_RUNS, (self.sql.id_array(ids),))
            for job_id in ids:
                for sql in self.sql.SQL_DELETE_JOB:
                    cur.execute(sql, (job_id,))
            return len(ids)
        return self.write(purge)

    def purge_in_slices(self, state: str, before: float, max_slices: int = 1 << 62,
                        purged: Callable[[int], None] = lambda count: None) -> int:
        """purge() in transactions of PURGE_SLICE jobs, so no write lock is held long (one transaction
        for a large purge holds every worker's heartbeat with it); returns how many.
        `purged(count)` hears the running total after each slice, for a progress line."""
        total = 0
        for _ in range(max_slices):
            removed = self.purge(state, before, PURGE_SLICE)
            total += removed
            purged(total)
            if removed < PURGE_SLICE:
                break
            # A short gap between slices: SQLite does not queue waiting writers, they poll, and one
            # that polls while we hold the lock waits for the next gap.
            time.sleep(0.01)
        return total

    def pause(self, queues: list[str]) -> None:
        """Stop claims from these queues ('*' = all, which also undoes every resume of a single queue)."""
        if "*" in queues:
            return self._change_pauses(self.sql.SQL_PAUSE_ALL, [()])
        self._change_pauses(self.sql.SQL_PAUSE, [(q,) for q in queues])  # its '!name' dropped, or its row added

    def resume(self, queues: list[str]) -> None:
        """Undo pause for these queues (while every queue is paused: for these ones only), or for
        everything when none are named."""
        if not queues:
            return self._change_pauses([self.sql.SQL_RESUME_ALL], [()], wake=True)
        self._change_pauses(self.sql.SQL_RESUME, [(q,) for q in queues], wake=True)  # its row, or '!name' added

    def _change_pauses(self, statements: list[str], params: list[tuple], wake: bool = False) -> None:
        def change(cur):
            if self.sql.SQL_LOCK_PAUSED:
                cur.execute(self.sql.SQL_LOCK_PAUSED)
            for sql in statements:
                cur.executemany(sql, params)
            if wake:
                self._wake_workers(cur)
        self.write(change)

    def paused(self) -> list[str]:
        """The paused table's rows, sorted: queue names, '*' (every queue) and '!name' (a queue resumed
        alone while every queue is paused); read them with is_paused."""
        return [r[0] for r in self.read(self.sql.SQL_PAUSED)]

    def set_limit(self, queue: str, max_running: int | None) -> None:
        """At most `max_running` jobs of `queue` processing at once (None: no limit)."""
        def set_limit(cur):
            if max_running is None:
                cur.execute(self.sql.SQL_REMOVE_LIMIT, (queue,))
            else:
                if self.sql.SQL_LOCK_LIMITS:
                    cur.execute(self.sql.SQL_LOCK_LIMITS)
                cur.execute(self.sql.SQL_SET_LIMIT, (queue, max_running))
            self._wake_workers(cur)  # a raised or removed limit may let a waiting job run now
        self.write(set_limit)

    def limits(self) -> dict[str, int]:
        """Queue name -> its limit, for the queues that have one."""
        return dict(self.read(self.sql.SQL_LIMITS))

    def queues(self) -> list[dict]:
        """Every queue that has jobs, a limit or a pause: its counts by state, paused, limit; by name."""
        counts: dict[str, dict[str, int]] = {}
        for queue, state, n in self.queue_counts():
            counts.setdefault(queue, dict.fromkeys(STATES, 0))[state] = n
        paused, limits = self.paused(), self.limits()
        names = sorted(set(counts) | set(limits) | (set(paused_names(paused)[0]) - {"*"}))
        return [{"queue": q, "jobs": counts.get(q, dict.fromkeys(STATES, 0)), "paused": is_paused(q, paused),
                 "limit": limits.get(q)} for q in names]

    def stats(self, since: float, now: float) -> dict:
        """Outcome counts, duration and wait percentiles over runs that ended since `since`."""
        outcomes = self.outcomes(since)
        times = self.read(self.sql.SQL_STATS_TIMES, (since,))
        oldest = min(self.oldest_eligible_by_queue(now).values(), default=None)
        return {"outcomes": outcomes, "duration": percentiles(t[0] for t in times),
                "wait": percentiles(t[1] for t in times),
                "oldest_eligible_age_s": None if oldest is None else max(0.0, now - oldest)}

    def outcomes(self, since: float) -> dict[str, int]:
        """Runs that ended since `since`, counted by outcome."""
        return dict(self.read(self.sql.SQL_STATS_OUTCOMES, (since,)))

    def run_totals(self) -> tuple[int, int]:
        """Runs ever ended completed, failed or dead, and their total duration in microseconds (never less
        than at the last call: deleted jobs' runs stay counted)."""
        count, micros, forgotten = self.read(self.sql.SQL_RUN_TOTALS)[0]
        gone_count, gone_micros = json.loads(forgotten) if forgotten else (0, 0)
        return int(count) + gone_count, int(micros) + gone_micros

    def queue_counts(self) -> list[tuple[str, str, int]]:
        """(queue, state, jobs) for every queue and state that has jobs."""
        return self.read(self.sql.SQL_QUEUE_COUNTS)

    def oldest_eligible_by_queue(self, now: float) -> dict[str, float]:
        """Queue -> eligible_at of its longest-waiting eligible job (due, no unfinished dependency, not paused)."""
        return dict(self.read(self.sql.SQL_OLDEST_ELIGIBLE_BY_QUEUE, (now,)))

    def runs_per_minute(self, start: float) -> list[tuple]:
        """(minute from `start`, outcome, count) of the runs that ended completed, failed or dead since `start`."""
        return self.read(self.sql.SQL_RUNS_PER_MINUTE, (start, start))

    # -- workers --------------------------------------------------------------------------------

    def register(self, worker_id: str, identity: dict, threads: int, now: float, queues: tuple = ()) -> None:
        """Add this worker process to the workers table, with the queues it serves (none named: all) and
        its version; BadDatabase if a newer queuectl upgraded the schema since we opened it."""
        def insert(cur):
            # In the registration's transaction: a migration that committed before it is seen here, and
            # one that commits after it sees us (see refuse_older_workers).
            version = cur.execute(self.sql.SQL_VERSION).fetchone()[0]
            if version > SCHEMA_VERSION:
                raise self._too_new(version)
            cur.execute(self.sql.SQL_REGISTER, (
                worker_id, identity["host"], identity["pid"], identity["proc_start"], identity["boot_id"],
                identity["pid_ns"], threads, now, now, json.dumps(list(queues)) if queues else None, __version__))
        self.write(insert)

    def schema_version(self) -> int:
        """The database's schema version now (a worker checks it at every heartbeat)."""
        return self.read(self.sql.SQL_VERSION)[0][0]

    def moved_on(self) -> str | None:
        """Why a worker may no longer serve this database (a newer queuectl upgraded its schema), or None."""
        version = self.schema_version()
        if version <= SCHEMA_VERSION:
            return None
        return (f"{self.path} was upgraded to schema {version} by a newer queuectl, and this worker "
                f"(queuectl {__version__}) knows schema {SCHEMA_VERSION} only: start workers of the new version")

    def _too_new(self, version: int) -> BadDatabase:
        return BadDatabase(f"{self.path} has schema version {version}, newer than this queuectl "
                           f"({__version__}, schema {SCHEMA_VERSION}); upgrade queuectl")

    def refuse_older_workers(self, cur, version: int, now: float) -> None:
        """Inside the migration's transaction, before it changes anything: UpgradeRefused if a worker
        registered in this database at its older `version` looks alive (see looks_alive). It runs the
        older schema's rules, and would go on claiming by them on the new one."""
        if not 1 <= version < SCHEMA_VERSION:
            return
        older = self.sql.SQL_OLDER_WORKERS_VERSIONED if version >= VERSIONED_WORKERS else self.sql.SQL_OLDER_WORKERS
        stored = cur.execute(self.sql.SQL_CONFIG_GET, ("stale_timeout",)).fetchone()
        stale_s, me = json.loads(stored[0]) if stored else CONFIG["stale_timeout"][0], host_identity()
        live = [w for w in (OlderWorker(*row) for row in cur.execute(older).fetchall())
                if looks_alive(w, me, now, stale_s)]
        if not live:
            return
        named = ", ".join(f"{printable(w.host)} PID {w.pid} (queuectl "
                          f"{printable(w.version) if w.version else f'{UNRECORDED_VERSION}, schema {version} or older'})"
                          for w in live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
        raise UpgradeRefused(
            f"{self.path} has schema {version}, and queuectl {__version__} would upgrade it to schema {SCHEMA_VERSION} "
            f"under {len(live)} running worker(s) of an older queuectl: {named}. Nothing was changed: stop them first "
            f"(`queuectl worker stop --wait` with the queuectl they run, or SIGTERM), then run this again and start "
            f"workers of queuectl {__version__}")

    def heartbeat(self, worker_id: str, now: float) -> bool | None:
        """Refresh our heartbeat; returns whether a stop was requested, or None if our row is gone."""
        def beat(cur):
            if cur.execute(self.sql.SQL_HEARTBEAT, (now, worker_id)).rowcount != 1:
                return None
            return bool(cur.execute(self.sql.SQL_STOP_REQUESTED, (worker_id,)).fetchone()[0])
        return self.write(beat)

    def deregister(self, worker_id: str) -> None:
        """Remove this worker's row (on a clean exit)."""
        self.write(lambda cur: cur.execute(self.sql.SQL_DEREGISTER, (worker_id,)))

    def workers(self) -> list[WorkerRow]:
        """Every registered worker."""
        return [WorkerRow(*r) for r in self.read(self.sql.SQL_WORKERS)]

    def processing_by_worker(self) -> dict[str, list[str]]:
        """Worker id -> ids of the jobs it is running."""
        held: dict[str, list[str]] = {}
        for worker_id, job_id in self.read(self.sql.SQL_PROCESSING_BY_WORKER):
            held.setdefault(worker_id, []).append(job_id)
        return held

    def cancel_requests(self, worker_id: str) -> set[tuple[str, int]]:
        """(id, run) of this worker's running jobs that a user asked to cancel."""
        return {(r[0], r[1]) for r in self.read(self.sql.SQL_CANCEL_REQUESTS, (worker_id,))}

    def request_stop(self, worker_ids: list[str]) -> list[str]:
        """Ask these workers to stop; returns those that were asked (see SQL_REQUEST_STOP)."""
        return self.write(lambda cur: [w for w in worker_ids if cur.execute(self.sql.SQL_REQUEST_STOP, (w,)).rowcount])

    def swept_jobs(self, worker_id: str) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """What the sweep of worker `worker_id` looks at, in one read (one snapshot and, on PostgreSQL, one
        round trip: an idle worker sweeps every second): the orphans, (id, run_count, worker_id) of processing
        jobs whose worker is not registered; the adopted, (id, run_count, worker id of the run) of its
        processing jobs whose run another worker started, which it has not requeued yet (a sweeper whose
        requeue failed finds them here at its next sweep); its own runs, (id, run_count) of those whose run
        it started."""
        orphans, adopted, own = [], [], []
        for job_id, run_no, owner, run_worker in self.read(self.sql.SQL_SWEPT_JOBS, (worker_id,)):
            if owner != worker_id:
                orphans.append((job_id, run_no, owner))
            elif run_worker == worker_id:
                own.append((job_id, run_no))
            elif run_worker is not None:
                adopted.append((job_id, run_no, run_worker))
        return orphans, adopted, own

    def drop_worker(self, worker_id: str, beat: int, started_at: float, adopter: str) -> list[tuple] | None:
        """Deregister a worker judged dead at heartbeat `beat`, hand the jobs it held to `adopter`
        (see self.sql.SQL_ADOPT) and return their (id, run_count, worker id of the run); None if it beat
        since (or is gone). One transaction, so the list is final even if the worker comes back and
        registers again right after."""
        def drop(cur):
            if cur.execute(self.sql.SQL_DROP_DEAD_WORKER, (worker_id, started_at, beat)).rowcount != 1:
                return None
            return [run for run in cur.execute(self.sql.SQL_HELD_RUNS, (worker_id,)).fetchall()
                    if cur.execute(self.sql.SQL_ADOPT, (adopter, run[0], run[1], worker_id)).rowcount]
        return self.write(drop)

    def adopt(self, job_id: str, run_no: int, owner: str, adopter: str) -> str | None:
        """Take over the recovery of an orphan (a processing job whose worker is not registered);
        returns the worker id its run was started by, or None if another sweeper took it first."""
        def take(cur):
            if not cur.execute(self.sql.SQL_ADOPT, (adopter, job_id, run_no, owner)).rowcount:
                return None
            row = cur.execute(self.sql.SQL_RUN_WORKER, (job_id, run_no)).fetchone()
            return row[0] if row else owner
        return self.write(take)

    # -- schedules ------------------------------------------------------------------------------

    def add_schedule(self, schedule: Schedule) -> None:
        """Store a validated schedule; Conflict if its id is taken. The newest slot job an earlier
        schedule of the same id made is its previous job, so `overlap: skip` holds across a re-add."""
        def insert(cur):
            # In the insert's transaction: what it finds is what the schedule starts from.
            previous = self._newest_slot_job(cur, schedule.id)
            last_job_id, last_run_at = previous or (schedule.last_job_id, schedule.last_run_at)
            row = (schedule.id, schedule.cron, schedule.every_s, schedule.tz, schedule.overlap,
                   json.dumps(schedule.job), schedule.created_at, int(schedule.paused), schedule.next_run_at,
                   last_run_at, last_job_id)
            try:
                cur.execute(self.sql.SQL_INSERT_SCHEDULE, row)
                self._wake_for_schedules(cur)
            except self.IntegrityError:
                raise Conflict(f"schedule {schedule.id!r} already exists") from None
        self.write(insert)

    def _newest_slot_job(self, cur: Cursor, schedule_id: str) -> tuple[str, float] | None:
        """(id, slot) of the job with the latest slot among those whose id is `schedule_id`, '@' and a
        slot time as slot_text writes it; an id of that shape naming no real time is passed over."""
        prefix = below = f"{schedule_id}@"
        below += ":"  # the character after '9': every slot time sorts below it
        while (job_id := cur.execute(self.sql.SQL_NEWEST_SLOT_JOB,
                                     {"prefix": prefix, "below": below}).fetchone()[0]) is not None:
            slot = slot_of(job_id[len(prefix):])
            if slot is not None:
                return job_id, slot
            below = job_id
        return None

    def schedules(self, schedule_id: str | None = None) -> list[Schedule]:
        """Every schedule by id (or the one named), each with its last job's state."""
        where, params = _where(self.sql.PARAM, id=schedule_id)
        return [Schedule.from_row(r) for r in self.read(self.sql.SQL_SCHEDULES.format(where=where), params)]

    def schedule(self, schedule_id: str) -> Schedule:
        """One schedule; NotFound if absent."""
        found = self.schedules(schedule_id)
        if not found:
            raise NotFound(f"no schedule with id {schedule_id!r}")
        return found[0]

    def next_schedule_at(self) -> float | None:
        """The earliest slot any schedule that is not paused waits for (one index lookup)."""
        return self.read(self.sql.SQL_NEXT_SCHEDULE)[0][0]

    def fire_schedules(self, now: float, made: Callable[[str], None] = lambda job_id: None) -> list[tuple]:
        """Fire every due schedule in one transaction (see firing_rule): enqueue its slot's job, unless
        that job exists already, and move it to its next slot. Returns (schedule id, slot or None,
        job id or None, what happened) for each; a schedule this host cannot compute (its zone is
        unknown here) is left for another worker. `made(job id)` hears of each job before the commit
        that makes it claimable (again if the transaction runs again)."""
        def fire(cur):
            rows = cur.execute(self.sql.SQL_DUE_SCHEDULES, (now,)).fetchall()
            events = [self._fire_one(cur, Schedule.from_row(row), defaults, now) for row in rows]
            jobs = [event[2] for event in events if event[2]]
            for job_id in jobs:
                made(job_id)
            if jobs:
                self._wake_workers(cur)
            return events
        defaults = self.config_all()  # the jobs' max_retries and timeout, when their template has none
        return self.write(fire)

    def _fire_one(self, cur: Cursor, schedule: Schedule, defaults: dict, now: float) -> tuple:
        try:
            slot, following = firing_rule(schedule, now)
            spec = slot_job(schedule, slot, defaults) if slot is not None else None
        except QueueError as e:
            return schedule.id, None, None, f"not fired here: {e}"
        job_id = spec and spec["id"]
        made = bool(spec) and cur.execute(self.sql.SQL_INSERT_SLOT_JOB, self._row(spec, 0, now)).rowcount == 1
        cur.execute(self.sql.SQL_SCHEDULE_FIRED, (following, slot, job_id, schedule.id, schedule.next_run_at))
        if not spec:
            return (schedule.id, None, None, f"slot skipped (overlap skip): job {schedule.last_job_id} "
                    f"is still {schedule.last_job_state}")
        return schedule.id, slot, job_id if made else None, f"job {job_id} {'enqueued' if made else 'already exists'}"

    def pause_schedules(self, schedule_ids: list[str]) -> None:
        """Pause schedules, all or nothing: their slots pass without jobs."""
        def pause(cur):
            self._schedules_in(cur, schedule_ids)
            cur.executemany(self.sql.SQL_PAUSE_SCHEDULE, [(i,) for i in schedule_ids])
        self.write(pause)

    def resume_schedules(self, schedule_ids: list[str], now: float) -> None:
        """Resume paused schedules, all or nothing, from their first slot after `now`: slots missed
        while paused do not fire. A schedule that is not paused is left as it is."""
        def resume(cur):
            for schedule in self._schedules_in(cur, schedule_ids):
                if schedule.paused:
                    cur.execute(self.sql.SQL_RESUME_SCHEDULE, (next_slot(schedule, now), schedule.id))
                    self._wake_for_schedules(cur)
        self.write(resume)

    def remove_schedules(self, schedule_ids: list[str]) -> None:
        """Remove schedules, all or nothing; the jobs they made stay."""
        def remove(cur):
            self._schedules_in(cur, schedule_ids)
            cur.executemany(self.sql.SQL_REMOVE_SCHEDULE, [(i,) for i in schedule_ids])
        self.write(remove)

    def update_schedule(self, schedule: Schedule, now: float | None = None) -> None:
        """Replace a schedule's cron or every, zone, overlap and template with a validated schedule's, in one
        transaction; NotFound if absent. What it did stays: its last job (so `overlap: skip` still waits
        for it), pause and anchor (an `every` keeps its slot times); its next slot is its first after `now`
        (default: the clock once the row is held), so slots already passed are not fired."""
        def update(cur):
            [stored] = self._schedules_in(cur, [schedule.id])
            # Read after the wait for the lock: a slot a worker fired meanwhile is passed too.
            after = self.now() if now is None else now
            following = next_slot(Schedule(**{**schedule.__dict__, "created_at": stored.created_at}), after)
            cur.execute(self.sql.SQL_UPDATE_SCHEDULE, (schedule.cron, schedule.every_s, schedule.tz, schedule.overlap,
                                                       json.dumps(schedule.job), following, schedule.id))
            self._wake_for_schedules(cur)
        self.write(update)

    def _schedules_in(self, cur: Cursor, schedule_ids: list[str]) -> list[Schedule]:
        """The named schedules, read to be changed (locked on PostgreSQL); NotFound naming the first
        unknown one, before anything is changed."""
        rows = [cur.execute(self.sql.SQL_SCHEDULE_TO_CHANGE, (i,)).fetchone() for i in schedule_ids]
        missing = next((i for i, row in zip(schedule_ids, rows) if row is None), None)
        if missing is not None:
            raise NotFound(f"no schedule with id {missing!r}")
        return [Schedule.from_row(row) for row in rows]

    # -- config ---------------------------------------------------------------------------------

    def config_get(self, key: str) -> float | int:
        """A config value (stored or default)."""
        rows = self.read(self.sql.SQL_CONFIG_GET, (key,))
        return json.loads(rows[0][0]) if rows else CONFIG[key][0]

    def config_all(self) -> dict:
        """Every config value, defaults filled in."""
        stored = {k: json.loads(v) for k, v in self.read(self.sql.SQL_CONFIG_ALL)}
        return {key: stored.get(key, default) for key, (default, _) in CONFIG.items()}

    def config_set(self, key: str, value: float | int) -> None:
        """Store a validated config value."""
        self.write(lambda cur: cur.execute(self.sql.SQL_CONFIG_SET, (key, json.dumps(value))))

    def set_lease(self, stale_s: float) -> None:
        """A worker's stale-timeout changed: PostgreSQL bounds its connection's waits by it; a local
        file cannot hang that way."""


class SqliteStore(Store):
    """A Store on one SQLite file: WAL, BEGIN IMMEDIATE transactions, busy retries."""
    sql = SqliteSQL
    IntegrityError = sqlite3.IntegrityError
    one_writer = True

    def __init__(self, path: str, *, durable: bool = True, busy_deadline_s: float = CLI_BUSY_DEADLINE_S,
                 reads_only: bool = False, give_up=lambda: False, shared: bool = False, peek: bool = False):
        """`reads_only`: the caller never writes; an existing database this user cannot write is then
        opened read-only (see _connect_read_only), and every connection refuses writes.

        `peek`: reads_only, and the file is opened read-only even when this user could write it, so
        nothing is ever written, not even an upgrade or a checkpoint: an older schema is refused (a shell
        completion, see Completion). busy_deadline_s also bounds SQLite's own busy wait.

        `shared`: threads share this Store (a worker's runners), so its reads take the process's turn
        too, as its writes always do: one connection is never used by two threads at once. Why share:
        a connection drops its whole page cache whenever another connection has written the file, so
        runners with a connection each, writing in turns anyway, re-read every page of every claim;
        one shared connection keeps them cached (figures in DECISIONS.md)."""
        self.path = self.target = path
        self.busy_deadline_s = busy_deadline_s
        self.give_up = give_up  # True ends busy retries early (a worker's hard stop)
        self.turn = _process_lock(path)
        self.shared = shared
        self.durable, self.reads_only, self.peek = durable, reads_only or peek, peek
        self.wake_ids: list[str] = []  # the workers the transaction under way wakes (see _wake_workers)
        self.waker: WakeSender | None = None
        self._open()

    def now(self) -> float:
        """The current time in Unix seconds: this machine's clock (the file has no other)."""
        return time.time()

    # -- opening --------------------------------------------------------------------------------

    def _open(self) -> None:
        """Open the file. A read-only open can race a writer that appears or leaves (its -wal comes
        and goes between our look and our read): then it is tried again, for a few seconds (or busy_deadline_s)."""
        deadline = self._open_deadline()
        while True:
            try:
                self._open_once()
            except _Raced:
                if time.monotonic() > deadline:
                    raise BadDatabase(f"cannot read {self.path}: it keeps changing under a read-only open; "
                                      "try again") from None
                time.sleep(0.01)
                continue
            if not (self.frozen and self._changed()):
                return
            self.conn.close()

    def _open_once(self) -> None:
        # The real path: SQLite keeps -wal and -shm beside the file a symlink points to.
        real = os.path.realpath(self.path)
        _check_regular(self.path, real)
        if self.reads_only and not os.path.exists(real):  # a reader never creates the file
            raise NoQueue(f"no queue at {os.path.abspath(self.path)} yet")
        self.read_only = self.reads_only and os.path.exists(real) and (self.peek or not _writable(real))
        if self.read_only:
            self.signature = _signature(real)
            self.conn, self.frozen = self._connect_read_only(real)
        else:
            self.conn, self.frozen = self._connect(self.path), False
        self.file_id, self.companion_ids = _file_id(real), {}  # what the path names now: see moved_on
        try:
            if self.read_only:
                self._check_readable()
            else:
                # FULL syncs the WAL on every commit: an enqueue that printed its id survives a power cut.
                # Workers use NORMAL: a lost worker write only means a job runs again (at-least-once).
                sync = "FULL" if self.durable else "NORMAL"
                self._retry(lambda: self.conn.execute(f"PRAGMA synchronous = {sync}"))
                self._migrate()
                # The -wal and -shm our connection opened (it has read): they stay while it is open, as
                # SQLite deletes them only when the last connection closes (see moved_on).
                self.companion_ids = {name: _file_id(name) for name in _companions(real)}
            if self.reads_only:
                self.query_only()
        except sqlite3.Error as e:
            self.conn.close()
            if self.read_only and e.sqlite_errorcode & 0xFF in RACED_READ_ERRORS:
                raise _Raced() from None
            raise database_error(self.path, e, opening=True, write=not self.read_only) from None
        except BaseException:
            self.conn.close()
            raise

    def moved_on(self) -> str | None:
        """As Store's, and also when the path no longer names the file we opened (deleted, or replaced by
        another): commands at that path use the new file, and the jobs they enqueue would wait for ever."""
        if _file_id(self.path) != self.file_id:
            return (f"{self.path} is no longer the database file this worker opened (deleted or replaced); "
                    "start a worker on the queue the path holds now")
        # Deleted under us (`rm queue.db-*`), they are made anew by the next command, which then sees none of
        # our writes nor we its: its jobs would wait for ever (and the file's pages are at risk).
        lost = [name for name, was in self.companion_ids.items() if was and _file_id(name) != was]
        if lost:
            return (f"{' and '.join(lost)}, which this worker opened with {self.path}, no longer exist as they were "
                    "(deleted?): other commands no longer see its changes, nor it theirs; start a worker again")
        return super().moved_on()

    def _changed(self) -> bool:
        """True if a writer may have touched a frozen (immutable=1) database since we opened it."""
        return _signature(os.path.realpath(self.path)) != self.signature

    def _connect(self, path: str) -> sqlite3.Connection:
        try:
            name = path
            if self.reads_only:  # mode=rw: a reader never creates the file, not even one deleted since it looked
                from urllib.parse import quote
                name = f"file://{quote(os.path.abspath(path))}?mode=rw"
            else:
                _create_private(path)
            return sqlite3.connect(name, uri=self.reads_only, timeout=self._busy_timeout_s(), isolation_level=None,
                                   check_same_thread=False)
        except OSError as e:
            raise BadDatabase(f"cannot open {path}: {_errno_text(e.errno) if e.errno else e}") from None
        except sqlite3.Error as e:
            if self.reads_only and not os.path.exists(os.path.realpath(path)):
                raise NoQueue(f"no queue at {os.path.abspath(path)} yet") from None
            raise database_error(path, e, opening=True) from None

    def _connect_read_only(self, path: str) -> tuple[sqlite3.Connection, bool]:
        """(connection, frozen) for a database this user may read but not write, creating no file.

        With its -wal and -shm present (a connection has it open, or one crashed), mode=ro reads
        through them. With no -wal, no connection has it open (SQLite deletes the -wal when the last
        one closes) and the file alone is the database: immutable=1 reads it without the -shm that a
        reader could not create. That is safe only while no writer opens it, so a frozen Store is
        reopened at every poll (refresh). A -wal without its -shm is a writer opening or closing it
        (a moment), or one that crashed: its commits need a -shm that only a writer can make.
        """
        from urllib.parse import quote
        wal, shm = _companions(path)
        deadline = self._open_deadline()
        while os.path.exists(wal) and not os.path.exists(shm):
            if time.monotonic() > deadline:
                raise BadDatabase(f"cannot read {path}: {wal} holds changes that need {shm}, which this user "
                                  f"cannot create; its owner ({_owner(path)}), or any user who can write it, "
                                  "restores it by running any queuectl command")
            time.sleep(0.01)
        frozen = not os.path.exists(wal)
        uri = f"file://{quote(os.path.abspath(path))}?mode=ro" + ("&immutable=1" if frozen else "")
        try:
            return sqlite3.connect(uri, uri=True, timeout=self._busy_timeout_s(), isolation_level=None,
                                   check_same_thread=False), frozen
        except sqlite3.Error as e:
            raise database_error(path, e, opening=True, write=False) from None

    def _busy_timeout_s(self) -> float:
        """SQLite's busy wait per attempt: never longer than the whole deadline (a completion's is short)."""
        return min(BUSY_TIMEOUT_S, self.busy_deadline_s)

    def _open_deadline(self) -> float:
        """When an open that races a writer stops trying again: a few seconds, or busy_deadline_s if shorter."""
        return time.monotonic() + min(CLI_BUSY_DEADLINE_S, self.busy_deadline_s)

    def _check_readable(self) -> None:
        """A read-only database must be ours and need no migration: it cannot be written to run one."""
        self._check_identity()
        version = self._read_version()
        if version < SCHEMA_VERSION:
            raise BadDatabase(f"cannot read {self.path}: it needs a schema upgrade (version {version} to "
                              f"{SCHEMA_VERSION}) and this user cannot write it; its owner ({_owner(self.path)}), "
                              "or any user who can write it, upgrades it by running any queuectl command that "
                              "writes (such as enqueue or config set)")

    def refresh(self) -> None:
        """Reopen a frozen Store (see _connect_read_only) before a poll reads again; no-op otherwise."""
        if self.frozen:
            self.conn.close()
            self._open()

    def _migrate(self) -> None:
        """Check the file is ours, then bring the schema up to date; safe against concurrent first opens."""
        self._check_identity()
        if self._read_version() == SCHEMA_VERSION:
            return
        self._retry(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
        self.write(self._apply_migrations)
        _make_private(self.path)

    def _read_version(self) -> int:
        return self._retry(lambda: self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _check_identity(self) -> None:
        # One statement, so one snapshot: read piecemeal, a migration committing in between
        # would show tables without our application id and look like someone else's file.
        app, tables, version = self.read(self.sql.SQL_IDENTITY)[0]
        if app != APPLICATION_ID and (app != 0 or tables or version):
            raise BadDatabase(f"{self.path} is not a queuectl database")
        if version > SCHEMA_VERSION:
            raise self._too_new(version)

    def _apply_migrations(self, cur: sqlite3.Cursor) -> None:
        # Re-read inside BEGIN IMMEDIATE: another process may have migrated while we waited. The check for
        # live older workers is in it too: no worker registers between the check and the migration.
        version = cur.execute("PRAGMA user_version").fetchone()[0]
        self.refuse_older_workers(cur, version, self.now())
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in script if isinstance(script, list) else filter(str.strip, script.split(";")):
                cur.execute(statement)
            cur.execute(f"PRAGMA user_version = {number}")
        cur.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
        if self.waker:
            self.waker.close()

    def query_only(self) -> None:
        """Make this connection refuse every write (a Store for a command or request that only reads)."""
        self.conn.execute(self.sql.SQL_QUERY_ONLY)

    # -- transactions ---------------------------------------------------------------------------

    def _retry(self, fn):
        """Run fn, retrying `database is locked` with a short random backoff until the deadline.

        busy_timeout alone does not prevent it (SQLite's busy handler can be starved), so a CLI
        command retries a few seconds and then reports Busy; a worker passes a long deadline.
        """
        deadline = time.monotonic() + self.busy_deadline_s
        while True:
            try:
                if not self.give_up():
                    return fn()
                # A hard stop has given up: one try that does not wait. Runner threads write in turns,
                # and each one's busy wait (a second) would add to the worker's exit.
                with self._busy_wait_off():
                    return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                import random
                if time.monotonic() >= deadline or self.give_up():
                    raise Busy(f"database is busy: {self.path} stayed locked by another process; "
                               "try again") from None
                time.sleep(random.uniform(0.005, 0.05))

    @contextlib.contextmanager
    def _busy_wait_off(self):
        """SQLite's busy wait off for what runs inside: a try that finds the database locked fails at once."""
        self.conn.execute("PRAGMA busy_timeout = 0")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s() * 1000)}")

    def write(self, fn):
        """Run fn(cursor) inside BEGIN IMMEDIATE (the write lock up front, so no upgrade deadlock).

        Threads of one process take turns on a Python lock first: SQLite's busy handler would make
        a thread that finds the database locked by its sibling sleep a millisecond or more, which
        at hundreds of jobs a second costs more than the work itself.
        """
        with self.turn:
            result = self._write(fn)
        self.committed = True
        return result

    def _write(self, fn):
        return self._retry(lambda: self._transaction(fn))

    def _transaction(self, fn):
        """One attempt: fn(cursor) between BEGIN IMMEDIATE and COMMIT, rolled back if anything fails."""
        cur = self.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        self.wake_ids = []
        try:
            result = fn(cur)
            cur.execute("COMMIT")
        except BaseException:
            self._roll_back(cur)
            raise
        if self.wake_ids:  # after the commit: a worker woken before it would find nothing
            if not (self.waker and self.waker.sock):  # none yet, or none was had (no descriptor left): try again
                self.waker = WakeSender()
            self.waker.send(self.path, self.wake_ids)
        return result

    def _roll_back(self, cur: sqlite3.Cursor) -> None:
        """Undo the transaction under way, for certain. A ROLLBACK that fails (an I/O error, a signal)
        may leave it open: holding the file's write lock, its half-done writes seen by the next read on
        this connection, every later BEGIN refused, so every thread sharing the connection would wedge.
        Then the connection is closed, which undoes the transaction, and opened again; the caller's
        error stands (a `locked` one is retried on the new connection, like any other)."""
        try:
            self.conn.rollback()
        except sqlite3.Error:
            pass  # still in the transaction or not, the check below makes sure it is gone
        finally:
            if self.conn.in_transaction:
                # Closing the cursor first: a statement left unfinished in it would keep the closed
                # connection's transaction, and its lock, alive until the cursor is freed.
                cur.close()
                self.conn.close()
                self._open()  # under the process's turn (see write), as every use of a shared connection

    def read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run one read-only statement with busy retries. A frozen Store (see _connect_read_only) that
        a writer touched while it read reopens and reads again: an immutable read of a changing
        file may fail ("malformed") or mix old and new pages."""
        if self.shared:
            with self.turn:
                return self._read(sql, params)
        return self._read(sql, params)

    def _read(self, sql: str, params: tuple) -> list[tuple]:
        for _ in range(100):
            try:
                rows = self._retry(lambda: self.conn.execute(sql, params).fetchall())
            except sqlite3.DatabaseError:
                if not (self.frozen and self._changed()):
                    raise
                rows = None
            if not (self.frozen and self._changed()):
                return rows
            self.refresh()
        raise BadDatabase(f"cannot read {self.path}: it keeps changing under a read-only open; try again")

    def _wake_workers(self, cur: sqlite3.Cursor) -> None:
        """Note the workers of this host, to wake once this transaction commits (see _transaction)."""
        rows = cur.execute(self.sql.SQL_HOST_WORKERS, (os.uname().nodename,))
        self.wake_ids = [worker_id for (worker_id,) in rows]

    def due_now(self, now: float, queues: tuple = ()) -> bool:
        """True if a claim now may find work: the poller's cheap check (a few index seeks)."""
        # Two reads, staged before ready: a staged job that a claim promotes (makes ready) between them is seen
        # by the second; read the other way round, it would be seen by neither.
        return bool(self.read(self.sql.SQL_ANY_STAGED, {"now": now})) or self._next_due(now, queues)

    def burst_done(self, now: float, queues: tuple = ()) -> bool:
        """True when nothing is processing (in these queues) and nothing is due within the burst horizon."""
        params = {"now": now + BURST_HORIZON_S, "queues": json.dumps(queues)}
        if queues:
            busy = self.read(self.sql.SQL_ANY_PROCESSING_FROM_QUEUES, params)
            staged = self.sql.SQL_STAGED_SOON_FROM_QUEUES
        else:
            busy = self.read(self.sql.SQL_ANY_PROCESSING_ANY_QUEUE)
            staged = self.sql.SQL_STAGED_SOON_ANY_QUEUE
        return not busy and not self.read(staged, params) and not self._next_due(params["now"], queues)  # see due_now

    def _next_due(self, now: float, queues: tuple) -> bool:
        """True if a claim at `now` would take a job (SQL_NEXT_DUE, the claim's own choice)."""
        return bool(self.read(self.sql.SQL_NEXT_DUE, {"now": now, "queues": _served(queues)}))

    def _claim_in(self, cur: sqlite3.Cursor, worker_id: str, now: float, queues: tuple) -> Job | None:
        # Asked first: the promotion's UPDATE builds a temporary table even when no staged job is due
        # (most claims), and this read is one index seek (figures in DECISIONS.md).
        if cur.execute(self.sql.SQL_ANY_STAGED, {"now": now}).fetchone():
            cur.execute(self.sql.SQL_PROMOTE, (now,))
        if HAS_RETURNING:
            row = cur.execute(self.sql.SQL_CLAIM, {"worker": worker_id, "now": now, "queues": _served(queues)}).fetchone()
        else:
            row = self._claim_without_returning(cur, worker_id, now, queues)
        if row is None:
            return None
        job = Job.from_row(row)
        cur.execute(self.sql.SQL_INSERT_RUN, (job.id, job.run_count, worker_id, now, eligible_at(job)))
        return job

    def _claim_without_returning(self, cur: sqlite3.Cursor, worker_id: str, now: float, queues: tuple) -> tuple | None:
        # SQLite < 3.35: select then update, still one BEGIN IMMEDIATE transaction, so no other
        # writer can slip in between; the state guard makes the update a no-op if it somehow did.
        if cur.execute(self.sql.SQL_REGISTERED, (worker_id,)).fetchone() is None:
            return None
        found = cur.execute(self.sql.SQL_NEXT_DUE, {"now": now, "queues": _served(queues)}).fetchone()
        if found is None or cur.execute(self.sql.SQL_CLAIM_ID, (worker_id, now, found[0])).rowcount != 1:
            return None
        return cur.execute(self.sql.SQL_GET_JOB, (found[0],)).fetchone()

    def flush_output(self, job: Job, tail: bytes, total: int) -> bool:
        """Store a running job's output so far (for `logs --follow`), only if that costs no waiting:
        the caller is the loop that reads the job's pipe, timeout and cancel checks included."""
        if not self.turn.acquire(blocking=False):
            return False
        # One try with SQLite's busy wait off: with the usual busy timeout, BEGIN IMMEDIATE would
        # block up to a second while another process writes, and so would the job's timeout and
        # cancel checks.
        try:
            with self._busy_wait_off():
                self._transaction(lambda cur: cur.execute(self.sql.SQL_FLUSH_OUTPUT,
                                                          (tail, total, job.id, job.run_count)))
            return True
        except sqlite3.Error:
            return False
        finally:
            self.turn.release()


def _served(queues: tuple) -> str | None:
    """The :queues of SQLite's claim statements: a JSON array of the served queues, or NULL for every queue."""
    return json.dumps(queues) if queues else None


# -- PostgreSQL -----------------------------------------------------------------------------------
#
# The same tables, columns and rules on a PostgreSQL server, in a schema of their own (`?schema=`,
# default queuectl). Where SQLite serializes every write transaction (BEGIN IMMEDIATE), PostgreSQL
# runs them side by side at READ COMMITTED, so the statements lock what a rule decides on: the claim
# takes its job with FOR UPDATE SKIP LOCKED and its worker row with FOR KEY SHARE (a sweeper's delete
# of that row waits for the claim, or the claim sees it gone), and a rule that reads a job's state
# before changing it (SQL_JOB_STATE, SQL_CANCEL_FLAG, SQL_DEAD_DEPS, SQL_PURGE_IDS) reads it FOR
# UPDATE, so nothing changes that job until the rule commits. Deadlocks between two such rules
# (`cancel a b` against `cancel b a`) roll one back, and write() runs it again.

PG_MIGRATIONS = [
    # 1: as SQLite's migration 1; deps gets `seq` for the order a job's dependencies were given in.
    """
    CREATE TABLE jobs (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        command TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts BIGINT NOT NULL DEFAULT 0,
        max_retries BIGINT NOT NULL,
        timeout_s DOUBLE PRECISION NOT NULL,
        cwd TEXT NOT NULL,
        env TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        next_run_at DOUBLE PRECISION NOT NULL,
        last_error TEXT,
        exit_code BIGINT,
        worker_id TEXT,
        run_count BIGINT NOT NULL DEFAULT 0,
        lost_count BIGINT NOT NULL DEFAULT 0,
        priority BIGINT NOT NULL DEFAULT 0,
        queue TEXT NOT NULL DEFAULT 'default',
        waiting_on BIGINT NOT NULL DEFAULT 0,
        cancel_requested BIGINT NOT NULL DEFAULT 0,
        ready SMALLINT NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_claim ON jobs (priority DESC, next_run_at, seq)
        WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1;
    CREATE INDEX jobs_staged ON jobs (next_run_at)
        WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0;
    CREATE INDEX jobs_state ON jobs (state, seq);
    CREATE INDEX jobs_worker ON jobs (worker_id) WHERE state = 'processing';
    CREATE INDEX jobs_finished ON jobs (state, updated_at) WHERE state IN ('completed', 'dead');
    CREATE TABLE deps (
        seq BIGSERIAL NOT NULL,
        job_id TEXT NOT NULL,
        dep_id TEXT NOT NULL,
        PRIMARY KEY (job_id, dep_id)
    );
    CREATE INDEX deps_dep ON deps (dep_id);
    CREATE TABLE runs (
        job_id TEXT NOT NULL,
        run_no BIGINT NOT NULL,
        worker_id TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        due_at DOUBLE PRECISION NOT NULL,
        ended_at DOUBLE PRECISION,
        outcome TEXT,
        exit_code BIGINT,
        error TEXT,
        output BYTEA,
        output_bytes BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, run_no)
    );
    CREATE INDEX runs_ended ON runs (ended_at);
    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        proc_start TEXT,
        boot_id TEXT,
        pid_ns TEXT,
        threads BIGINT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL,
        beat BIGINT NOT NULL DEFAULT 0,
        stop_requested SMALLINT NOT NULL DEFAULT 0
    );
    CREATE TABLE paused (queue TEXT PRIMARY KEY);
    CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT NOT NULL)
    """,
    # 2: as SQLite's migration 2; and jobs_claim now leads with the queue, as SQLite's always did, so
    # the claim looks at each queue's head (a paused or full queue's backlog costs it one index seek).
    """
    CREATE TABLE queue_limits (queue TEXT PRIMARY KEY, max_running BIGINT NOT NULL);
    CREATE INDEX jobs_running ON jobs (queue) WHERE state = 'processing';
    DROP INDEX jobs_claim;
    CREATE INDEX jobs_claim ON jobs (queue, priority DESC, next_run_at, seq)
        WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
    """,
    # 3: as SQLite's migration 3.
    """
    CREATE TABLE schedules (
        id TEXT PRIMARY KEY,
        cron TEXT,
        every_s BIGINT,
        tz TEXT NOT NULL,
        overlap TEXT NOT NULL,
        job TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        paused SMALLINT NOT NULL DEFAULT 0,
        next_run_at DOUBLE PRECISION,
        last_run_at DOUBLE PRECISION,
        last_job_id TEXT
    );
    CREATE INDEX schedules_due ON schedules (next_run_at) WHERE paused = 0
    """,
    # 4: as SQLite's migration 4.
    "ALTER TABLE workers ADD COLUMN queues TEXT",
    # 5: as SQLite's migration 5. A CHECK that skips the rows already there (NOT VALID) refuses a row without
    # a version as SQLite's trigger does (and the heartbeat of such a row, which no live worker has).
    """
    ALTER TABLE workers ADD COLUMN version TEXT;
    ALTER TABLE workers ADD CONSTRAINT workers_versioned CHECK (version IS NOT NULL) NOT VALID
    """,
    # 6: as SQLite's migration 6; the trigger's body is a function (the only one queuectl makes), which
    # resolves names in this schema whatever the caller's search_path (FROM CURRENT: the migration's).
    ["ALTER TABLE jobs ADD COLUMN on_dead TEXT",
     "ALTER TABLE jobs ADD COLUMN revived BIGINT NOT NULL DEFAULT 0",
     "ALTER TABLE jobs ADD COLUMN notifies TEXT",
     "CREATE INDEX jobs_notices ON jobs (queue, priority DESC, next_run_at, seq) "
     "WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1",
     """CREATE FUNCTION jobs_dead() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN
     INSERT INTO jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at,
         next_run_at, priority, queue, waiting_on, ready, notifies)
     SELECT substr(NEW.id, 1, 200 - length(n.suffix)) || n.suffix, n.command, 'pending',
         coalesce((SELECT (value::json #>> '{}')::bigint FROM config WHERE key = 'max_retries'), 3),
         coalesce((SELECT (value::json #>> '{}')::double precision FROM config WHERE key = 'job_timeout'), 0),
         NEW.cwd,
         json_build_object('QUEUECTL_DEAD_JOB_ID', NEW.id, 'QUEUECTL_DEAD_QUEUE', NEW.queue,
                           'QUEUECTL_DEAD_ATTEMPTS', NEW.attempts::text,
                           'QUEUECTL_DEAD_EXIT_CODE', CASE WHEN OLD.state = 'processing'
                                                           THEN coalesce(NEW.exit_code::text, '') ELSE '' END,
                           'QUEUECTL_DEAD_ERROR', coalesce(NEW.last_error, ''),
                           'QUEUECTL_DEAD_RUN', CASE WHEN OLD.state = 'processing' THEN NEW.run_count::text
                                                     ELSE '0' END)::text,
         NEW.updated_at, NEW.updated_at, NEW.updated_at, NEW.priority, NEW.queue, 0, 1, NEW.id
     FROM (SELECT coalesce(NEW.on_dead, (SELECT value::json #>> '{}' FROM config WHERE key = 'on_dead'), '') AS command,
                  '@dead-' || NEW.seq || '-' || NEW.revived AS suffix) AS n
     WHERE n.command <> ''
     ON CONFLICT (id) DO NOTHING;
     RETURN NULL;
     END $$""",
     "CREATE TRIGGER jobs_dead AFTER UPDATE OF state ON jobs FOR EACH ROW "
     "WHEN (NEW.state = 'dead' AND OLD.state <> 'dead' AND NEW.notifies IS NULL) EXECUTE FUNCTION jobs_dead()"],
]
# Every table the migrations create, whose owners an open checks (see SQL_OWNERS).
PG_TABLES = ("queuectl_version", "jobs", "deps", "runs", "workers", "config", "paused", "queue_limits", "schedules")
# pg_class.relkind of what may stand in a schema under one of those names, for the error that refuses it.
PG_RELKINDS = {"v": "a view", "m": "a materialized view", "f": "a foreign table", "p": "a partitioned table",
               "S": "a sequence", "i": "an index", "I": "a partitioned index", "c": "a composite type"}


@with_shared(lambda sql: sql)  # SharedSQL is written in PostgreSQL's marks
class PostgresSQL:
    """The PostgreSQL statements the store runs that are not SharedSQL's, each complete where it is
    defined; parameters are %s in the order the rules pass them, or %(name)s where a statement takes a dict."""
    PARAM = "%s"  # the parameter mark, for clauses the rules build (see _where)

    # The schema's own bookkeeping: which tables it holds (one snapshot, so a migration committing
    # meanwhile cannot show half of them), and its version, in a table that marks it as ours.
    SQL_IDENTITY = ("SELECT count(*), count(*) FILTER (WHERE tablename = 'queuectl_version') FROM pg_tables "
                    "WHERE schemaname = %s")
    SQL_SCHEMA_EXISTS = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
    SQL_VERSION = "SELECT version FROM queuectl_version"
    # Who owns the schema and each of our tables in it, from the catalog alone: an open runs it before any
    # statement reads a relation of the schema, whose owner could have made one of our names a view of a
    # function of theirs (or put a policy on a table) that would run as us. One row for the schema (table
    # NULL) and one per table of PG_TABLES it holds (by name: an index lookup each, where a scan of the
    # schema would read all of pg_class at every open): (table, relkind, owner, whether the owner is ours,
    # current_user, whether current_user is a superuser, a column of the table whose type is not
    # pg_catalog's, the roles not ours that may CREATE in the schema, the first object in it that one of
    # them made (first_planted), whether current_user may use the schema). Such a type would bring
    # operators its owner put in the schema into our statements; a role that may CREATE there can put in
    # an operator or function that matches our arguments more exactly than pg_catalog's, which then wins.
    # This statement runs with the schema on search_path, so every operator in it is pg_catalog's by name
    # (OPERATOR(pg_catalog.=)) and every function and type is qualified: nothing planted can be called.
    # A role is ours when it is current_user, a superuser (who can rewrite anything anyway), or one
    # current_user is a member of, unless current_user is a superuser, who is a member of every role:
    # for a superuser only its own and other superusers' objects are ours. pg_database_owner (PostgreSQL
    # 15's public) stands for the database's owner.
    SQL_OWNERS = """
    WITH me AS (SELECT r.oid, r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user),
    ours AS (SELECT r.oid FROM pg_catalog.pg_roles r CROSS JOIN me
             WHERE r.rolsuper OR r.oid OPERATOR(pg_catalog.=) me.oid
                OR NOT me.rolsuper AND pg_catalog.pg_has_role(me.oid, r.oid, 'MEMBER')),
    db AS (SELECT d.datdba FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()),
    o (relname, relkind, owner, strange_column, acl, nsp) AS (
        SELECT NULL::pg_catalog.name, NULL::pg_catalog."char", n.nspowner, NULL::pg_catalog.name, n.nspacl, n.oid
        FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s::pg_catalog.name
        UNION ALL
        SELECT c.relname, c.relkind, c.relowner,
               (SELECT a.attname FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t
                                  ON t.oid OPERATOR(pg_catalog.=) a.atttypid
                WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0::pg_catalog.int2
                  AND t.typnamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                LIMIT 1),
               NULL::pg_catalog.aclitem[], NULL::pg_catalog.oid
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
        WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s::pg_catalog.name
          AND c.relname OPERATOR(pg_catalog.=) ANY(%(tables)s::pg_catalog.name[])),
    -- What queuectl never makes in its schema: functions, operators, types other than its tables' (and
    -- their arrays), collations, conversions. One a role not ours put there (if only before its CREATE
    -- was revoked) could be what one of our statements calls, as us.
    planted (nsp, what, owner) AS (  -- (its first, if any; computed once: no reference to a row)
        SELECT p.pronamespace, pg_catalog.concat('function ', p.proname), p.proowner FROM pg_catalog.pg_proc p
        UNION ALL SELECT op.oprnamespace, pg_catalog.concat('operator ', op.oprname), op.oprowner
        FROM pg_catalog.pg_operator op
        UNION ALL SELECT t.typnamespace, pg_catalog.concat('type ', t.typname), t.typowner FROM pg_catalog.pg_type t
        WHERE t.typrelid OPERATOR(pg_catalog.=) 0::pg_catalog.oid AND NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_type e WHERE e.oid OPERATOR(pg_catalog.=) t.typelem
              AND e.typrelid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid)
        UNION ALL SELECT co.collnamespace, pg_catalog.concat('collation ', co.collname), co.collowner
        FROM pg_catalog.pg_collation co
        UNION ALL SELECT cv.connamespace, pg_catalog.concat('conversion ', cv.conname), cv.conowner
        FROM pg_catalog.pg_conversion cv),
    first_planted AS (
        SELECT pg_catalog.concat(p.what, ' of ', pg_catalog.pg_get_userbyid(p.owner)) AS what
        FROM planted p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.nsp
        WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s::pg_catalog.name
          AND NOT EXISTS (SELECT 1 FROM ours WHERE ours.oid OPERATOR(pg_catalog.=) p.owner) LIMIT 1),
    owned AS (  -- pg_database_owner, as an owner or a grantee, is the database's owner
        SELECT o.*, CASE WHEN pg_catalog.pg_get_userbyid(o.owner) OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.name
                         THEN db.datdba ELSE o.owner END AS role
        FROM o CROSS JOIN db)
    SELECT owned.relname, owned.relkind, r.rolname,
           EXISTS (SELECT 1 FROM ours WHERE ours.oid OPERATOR(pg_catalog.=) owned.role),
           current_user, me.rolsuper, owned.strange_column,
           (SELECT pg_catalog.string_agg(CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                             ELSE pg_catalog.pg_get_userbyid(x.grantee)::pg_catalog.text END, ', ')
            FROM pg_catalog.aclexplode(owned.acl) x
            WHERE x.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text
              AND NOT EXISTS (SELECT 1 FROM ours WHERE ours.oid OPERATOR(pg_catalog.=) CASE
                  WHEN pg_catalog.pg_get_userbyid(x.grantee) OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.name
                  THEN db.datdba ELSE x.grantee END)),
           CASE WHEN owned.nsp IS NOT NULL THEN (SELECT what FROM first_planted) END,
           owned.nsp IS NULL OR pg_catalog.has_schema_privilege(owned.nsp, 'USAGE')
    FROM owned JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) owned.role CROSS JOIN me CROSS JOIN db"""
    # The tables a migration creates in a schema without any of ours belong to the schema's owner, which
    # current_user may only be a member of (a team's role): a SET LOCAL ROLE to it, for the migration's
    # transaction. Not to a role current_user is no member of (a superuser's schema: the tables are ours).
    SQL_AS_SCHEMA_OWNER = (
        "SELECT pg_catalog.set_config('role', pg_catalog.pg_get_userbyid(nspowner)::pg_catalog.text, true) "
        "FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) %s::pg_catalog.name "
        "AND pg_catalog.pg_get_userbyid(nspowner) OPERATOR(pg_catalog.<>) current_user "
        "AND pg_catalog.pg_get_userbyid(nspowner) OPERATOR(pg_catalog.<>) 'pg_database_owner'::pg_catalog.name "
        "AND pg_catalog.pg_has_role(current_user, nspowner, 'MEMBER')")
    SQL_CREATE_VERSION = "CREATE TABLE queuectl_version (version BIGINT NOT NULL)"
    SQL_INIT_VERSION = "INSERT INTO queuectl_version (version) VALUES (0)"
    SQL_SET_VERSION = "UPDATE queuectl_version SET version = %s"
    # One migration at a time per schema, whoever runs it: a lock keyed by our id and the schema name.
    SQL_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
    SQL_CLOCK = "SELECT extract(epoch FROM clock_timestamp())::double precision"

    SQL_INSERT_DEP = "INSERT INTO deps (job_id, dep_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"
    # A batch's jobs without dependencies (PostgresStore._insert_rows and enqueue_streamed), as rows of
    # Store._row. It restates SharedSQL.SQL_INSERT_JOB, the statement Store._insert_rows runs for them
    # (its columns, in its order): a change to one is made to the other. The test
    # test_postgres_fast_paths_leave_the_rows_of_the_statements_they_restate compares their rows.
    SQL_COPY_JOBS = ("COPY jobs (id, command, state, max_retries, timeout_s, cwd, env, created_at, updated_at, "
                     "next_run_at, priority, queue, waiting_on, last_error, ready, on_dead) FROM STDIN")
    SQL_TAKEN_IDS = "SELECT id FROM jobs WHERE id = ANY(%s)"
    SQL_JOB_STATE = "SELECT state FROM jobs WHERE id = %s FOR UPDATE"  # see the comment above PG_MIGRATIONS
    # LIMIT NULL is no limit: the rules pass -1 for "all", as SQLite takes it.
    SQL_LIST_JOBS = (f"SELECT {Job.COLUMNS} FROM (SELECT * FROM jobs {{where}} ORDER BY seq DESC "
                     "LIMIT nullif(%s, -1)) AS newest ORDER BY seq")
    SQL_DEPS_OF = "SELECT dep_id FROM deps WHERE job_id = %s ORDER BY seq"
    # The claim keeps SQLite's split (see SqliteSQL): a waiting job is staged until due, then ready,
    # and the claim transaction first promotes what has fallen due. Rows another claimer is
    # promoting are skipped, not waited for: that claimer makes them ready.
    SQL_PROMOTE = """
    UPDATE jobs SET ready = 1
    WHERE seq IN (SELECT seq FROM jobs
                  WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= %s
                  FOR UPDATE SKIP LOCKED)"""
    # The queues a claim may take from now: every queue with a ready job when %(queues)s is NULL (the
    # skip-scan runs only then; unnest yields no row for NULL), else the named ones (`worker start
    # --queue`); limited: the queue has a limit; open: neither paused nor full (a closed queue's
    # notification jobs may still run: see SqliteSQL.SQL_NEXT_DUE). The claim and the poller
    # are each composed from this whole statement (one level), so they always serve the same queues.
    SQL_ELIGIBLE_QUEUES = """
    WITH RECURSIVE q(name) AS (  -- every queue with a ready job: one index seek per queue (a skip-scan)
        SELECT (SELECT queue FROM jobs WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
                ORDER BY queue LIMIT 1)
        WHERE %(queues)s::text[] IS NULL
        UNION ALL
        SELECT (SELECT queue FROM jobs WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
                  AND queue > q.name ORDER BY queue LIMIT 1)
        FROM q WHERE q.name IS NOT NULL),
    served(name) AS (SELECT name FROM q UNION ALL SELECT pg_catalog.unnest(%(queues)s::text[]))
    SELECT served.name, l.queue IS NOT NULL AS limited,
           CASE WHEN EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (served.name, '*'))
                     AND NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || served.name) THEN false  -- paused
                ELSE l.queue IS NULL OR l.max_running > (SELECT count(*) FROM jobs
                                                         WHERE state = 'processing' AND queue = served.name) END AS open
    FROM served LEFT JOIN queue_limits AS l ON l.queue = served.name
    WHERE served.name IS NOT NULL"""
    # The claim, as SQLite's: the head of each queue it may serve (jobs_claim leads with the queue), then
    # the best of those heads, so a paused or full queue costs one index seek whatever its backlog.
    # Parameters %(worker)s, %(now)s, %(queues)s (as SQL_ELIGIBLE_QUEUES), and the limited
    # queues whose row this transaction has locked (%(held)s) or found locked (%(busy)s). Each head is
    # taken FOR UPDATE SKIP LOCKED, so concurrent claims take different jobs and never wait for each
    # other; the worker row is read FOR KEY SHARE, so a sweeper that deletes it (drop_worker) either
    # waits for this claim and then adopts the job, or has deleted it and this claim takes nothing.
    # A queue with a limit is claimed from only under a lock on its queue_limits row (see _claim_in):
    # READ COMMITTED gives each statement its own snapshot, and only a statement that starts after
    # the lock is granted counts every claim committed by the previous holder. So when the best head
    # is in a limited queue this statement claims nothing and returns that queue (free = false), and
    # the claim runs it again holding the lock. Claims of unlimited queues take no such lock and stay
    # concurrent; a queue full by this snapshot is skipped without its lock. The claimed job's run
    # record is opened by the same statement (`opened`: started now, due when the job was). `opened`
    # restates SQLite's SQL_INSERT_RUN, which SqliteStore._claim_in runs with due_at = eligible_at(job)
    # (here GREATEST(next_run_at, created_at)): a change to one is made to the other. The statement
    # returns (best queue, free, the claimed job's columns or NULLs), or no row when no queue has a due job.
    SQL_CLAIM = f"""
    WITH eligible(name, limited, open) AS ({SQL_ELIGIBLE_QUEUES}),
    heads AS (  -- the best ready, due job of each open queue whose lock no other claim holds (busy), skipping
        -- rows other claimers hold; free: no limit, or this claim holds the queue's lock
        SELECT eligible.name, NOT eligible.limited OR eligible.name = ANY(%(held)s::text[]) AS free, head.*
        FROM eligible CROSS JOIN LATERAL (
            SELECT seq, priority, next_run_at FROM jobs
            WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1 AND queue = eligible.name
              AND next_run_at <= %(now)s
            ORDER BY priority DESC, next_run_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
        WHERE eligible.open AND NOT eligible.name = ANY(%(busy)s::text[])),
    notices AS (  -- the best notification job of each closed queue (jobs_notices): free of pauses and limits
        SELECT eligible.name, true AS free, notice.*
        FROM eligible CROSS JOIN LATERAL (
            SELECT seq, priority, next_run_at FROM jobs
            WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
              AND queue = eligible.name AND next_run_at <= %(now)s
            ORDER BY priority DESC, next_run_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) AS notice
        WHERE NOT eligible.open),
    best AS (SELECT * FROM (SELECT * FROM heads UNION ALL SELECT * FROM notices) AS h
             ORDER BY priority DESC, next_run_at, seq LIMIT 1),
    claimed AS (
        UPDATE jobs SET state = 'processing', worker_id = %(worker)s, run_count = run_count + 1, updated_at = %(now)s
        FROM best WHERE jobs.seq = best.seq AND best.free
          AND EXISTS (SELECT 1 FROM workers WHERE id = %(worker)s FOR KEY SHARE)
        RETURNING jobs.id, jobs.command, jobs.state, jobs.attempts, jobs.max_retries, jobs.timeout_s, jobs.cwd,
                  jobs.env, jobs.created_at, jobs.updated_at, jobs.next_run_at, jobs.last_error, jobs.exit_code,
                  jobs.worker_id, jobs.run_count, jobs.lost_count, jobs.priority, jobs.queue, jobs.waiting_on,
                  jobs.on_dead),
    opened AS (  -- due_at as eligible_at: the later of the due time and the enqueue
        INSERT INTO runs (job_id, run_no, worker_id, started_at, due_at)
        SELECT id, run_count, worker_id, %(now)s, GREATEST(next_run_at, created_at) FROM claimed)
    SELECT best.name, best.free, claimed.* FROM best LEFT JOIN claimed ON true"""
    # Serialises the claims of one limited queue until commit: the first lock a claim waits for; a
    # second one it only tries (SKIP LOCKED), so two claims never wait for each other's locks.
    SQL_LOCK_QUEUE = "SELECT 1 FROM queue_limits WHERE queue = %s FOR UPDATE"
    SQL_TRY_LOCK_QUEUE = "SELECT 1 FROM queue_limits WHERE queue = %s FOR UPDATE SKIP LOCKED"
    # The poller, as SQLite's: a ready, due job in a queue we serve that is neither paused nor full,
    # or a staged job that has fallen due anywhere (a claim promotes it).
    SQL_POLL = f"""
    WITH eligible(name, limited, open) AS ({SQL_ELIGIBLE_QUEUES})
    SELECT EXISTS (SELECT 1 FROM eligible CROSS JOIN LATERAL (  -- LIMIT: a seek per queue, never a join of all
                       SELECT 1 FROM jobs WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
                         AND queue = eligible.name AND next_run_at <= %(now)s LIMIT 1) AS head WHERE eligible.open)
        OR EXISTS (SELECT 1 FROM eligible CROSS JOIN LATERAL (  -- a closed queue's notification job
                       SELECT 1 FROM jobs WHERE notifies IS NOT NULL AND state IN ('pending', 'failed')
                         AND waiting_on = 0 AND ready = 1 AND queue = eligible.name AND next_run_at <= %(now)s
                       LIMIT 1) AS notice WHERE NOT eligible.open)
        OR EXISTS (SELECT 1 FROM jobs
                   WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at <= %(now)s)"""
    SQL_ANY_NOTICE = ("SELECT 1 FROM jobs WHERE notifies IS NOT NULL AND state IN ('pending', 'failed') "
                      "AND waiting_on = 0 AND ready = 1 LIMIT 1")  # as SQLite's (jobs_notices)
    # When the poller looks next: the earliest staged job not due yet (jobs_staged, as SQLite's).
    SQL_NEXT_STAGED = ("SELECT min(next_run_at) FROM jobs "
                       "WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 0 AND next_run_at > %s")
    # --burst: is anything processing in our queues, or due within the horizon (ready or staged) in
    # one of them that is not paused, or a notification job (which no pause holds back)?
    SQL_ANY_PROCESSING_FROM_QUEUES = "SELECT 1 FROM jobs WHERE state = 'processing' AND queue = ANY(%(queues)s) LIMIT 1"
    SQL_DUE_SOON_ANY_QUEUE = """
    SELECT EXISTS (SELECT 1 FROM jobs
                   WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND next_run_at <= %(soon)s
                     AND (notifies IS NOT NULL
                          OR NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (jobs.queue, '*'))
                          OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || jobs.queue)))"""
    SQL_DUE_SOON_FROM_QUEUES = """
    SELECT EXISTS (SELECT 1 FROM jobs
                   WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND next_run_at <= %(soon)s
                     AND queue = ANY(%(queues)s)
                     AND (notifies IS NOT NULL
                          OR NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (jobs.queue, '*'))
                          OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || jobs.queue)))"""
    # A flush is worth no wait: a row lock held longer than this makes it give up (see flush_output).
    SQL_FLUSH_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '50ms'"
    # A completed run in one statement, for a worker's hot path (see PostgresStore.finish_and_claim):
    # SQL_FINISH_JOB, then only if it changed the job (still ours) SQL_FINISH_RUN and
    # SQL_RELEASE_DEPENDENTS, and a wake-up if it released a dependent or freed a limited queue's slot.
    # Returns (1, or 0 when the job was no longer ours and nothing was written; 1 if the workers were
    # woken, else 0). It reads deps as of its start: the job's row must be locked before it (see
    # PostgresStore._complete_and_claim).
    # It restates Store._finish_in's path for a completed run (SharedSQL.SQL_FINISH_JOB, then
    # SQL_FINISH_RUN in _close_run, SQL_RELEASE_DEPENDENTS and _wake_workers in _settle_dependents,
    # SQL_RUN_TIES's limit): a change to one is made to the other. The test
    # test_postgres_fast_paths_leave_the_rows_of_the_statements_they_restate compares their rows.
    SQL_COMPLETE = """
    WITH finished AS (
        UPDATE jobs SET state = 'completed', attempts = %(attempts)s, next_run_at = %(next_run_at)s,
            last_error = %(error)s, exit_code = %(exit_code)s, worker_id = NULL, updated_at = %(now)s, ready = 0
        WHERE id = %(id)s AND state = 'processing' AND worker_id = %(worker)s AND run_count = %(run)s
        RETURNING id),
    closed AS (
        UPDATE runs SET ended_at = coalesce(started_at + %(duration)s, GREATEST(%(now)s, started_at)),
            outcome = 'completed', exit_code = %(exit_code)s, error = %(error)s, output = coalesce(%(output)s, output),
            output_bytes = GREATEST(output_bytes, %(output_bytes)s)
        WHERE job_id IN (SELECT id FROM finished) AND run_no = %(run)s),
    released AS (
        UPDATE jobs SET waiting_on = waiting_on - 1, next_run_at = GREATEST(next_run_at, %(now)s), updated_at = %(now)s
        WHERE id IN (SELECT job_id FROM deps WHERE dep_id IN (SELECT id FROM finished)) AND waiting_on > 0
        RETURNING id),
    woken_by(reason) AS (  -- a released dependent, or a freed slot of a limited queue
        SELECT 1 FROM released
        UNION ALL SELECT 1 FROM queue_limits WHERE queue = %(queue)s AND EXISTS (SELECT 1 FROM finished))
    SELECT (SELECT count(*) FROM finished),
           (SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '') FROM woken_by LIMIT 1) AS woken)"""
    # FOR UPDATE: a cancel cannot land between this read and the write that follows it.
    SQL_CANCEL_FLAG = ("SELECT cancel_requested = run_count FROM jobs "
                       "WHERE id = %s AND state = 'processing' AND worker_id = %s AND run_count = %s FOR UPDATE")
    SQL_FINISH_RUN = ("UPDATE runs SET ended_at = coalesce(started_at + %s, GREATEST(%s, started_at)), outcome = %s, "
                      "exit_code = %s, error = %s, output = coalesce(%s, output), "
                      "output_bytes = GREATEST(output_bytes, %s) WHERE job_id = %s AND run_no = %s")
    SQL_RELEASE_DEPENDENTS = ("UPDATE jobs SET waiting_on = waiting_on - 1, next_run_at = GREATEST(next_run_at, %s), "
                              "updated_at = %s WHERE id IN (SELECT job_id FROM deps WHERE dep_id = %s) "
                              "AND waiting_on > 0")
    # Recovery by adoption, as SQLite's SQL_ADOPT (parameters: adopter, job id, run number, owner).
    SQL_ADOPT = ("UPDATE jobs SET worker_id = adopter.id FROM workers AS adopter "
                 "WHERE adopter.id = %s AND jobs.id = %s AND jobs.run_count = %s AND jobs.state = 'processing' "
                 "AND jobs.worker_id = %s AND NOT EXISTS (SELECT 1 FROM workers WHERE workers.id = jobs.worker_id)")
    SQL_RUN = ("SELECT run_no, output, output_bytes, ended_at FROM runs "
               "WHERE job_id = %s AND (run_no = %s OR %s::bigint IS NULL) ORDER BY run_no DESC LIMIT 1")
    # Every dependency is locked, not only the dead ones: the waiting_on that SQL_RETRY counts next
    # must not change before the retry commits.
    SQL_DEAD_DEPS = ("SELECT dep_id FROM (SELECT d.id AS dep_id, d.state FROM deps JOIN jobs d ON d.id = deps.dep_id "
                     "WHERE deps.job_id = %s FOR UPDATE OF d) AS locked WHERE state = 'dead'")
    SQL_FORGET_RUNS = (
        "INSERT INTO config (key, value) SELECT 'runs_forgotten', json_build_array(count(*), "
        "sum(round((ended_at - started_at) * 1000000)::bigint))::text FROM runs "
        "WHERE job_id = ANY(%s) AND outcome IN ('completed', 'failed', 'dead') HAVING count(*) > 0 "
        "ON CONFLICT (key) DO UPDATE SET value = json_build_array("
        "(config.value::json ->> 0)::bigint + (excluded.value::json ->> 0)::bigint, "
        "(config.value::json ->> 1)::bigint + (excluded.value::json ->> 1)::bigint)::text")
    SQL_DELETE_JOB = ["DELETE FROM runs WHERE job_id = %s", "DELETE FROM deps WHERE %s IN (job_id, dep_id)",
                      "DELETE FROM jobs WHERE id = %s"]
    SQL_PURGE_IDS = ("SELECT id FROM jobs WHERE state = %s AND updated_at < %s AND (state = 'completed' OR NOT EXISTS "
                     "(SELECT 1 FROM deps JOIN jobs j ON j.id = deps.job_id WHERE deps.dep_id = jobs.id "
                     "AND j.state <> 'completed')) LIMIT nullif(%s, -1) FOR UPDATE")
    SQL_PAUSE_ALL = SqliteSQL.SQL_PAUSE_ALL
    SQL_PAUSE = ["DELETE FROM paused WHERE queue = '!' || %s::text",
                 "INSERT INTO paused (queue) SELECT %s::text "
                 "WHERE NOT EXISTS (SELECT 1 FROM paused WHERE queue = '*') ON CONFLICT DO NOTHING"]
    SQL_RESUME = ["DELETE FROM paused WHERE queue = %s",
                  "INSERT INTO paused (queue) SELECT '!' || %s::text "
                  "WHERE EXISTS (SELECT 1 FROM paused WHERE queue = '*') ON CONFLICT DO NOTHING"]
    # Pauses and resumes one at a time, so a queue never ends with both its row and '!name' (each reads
    # what the other writes); and a pause waits for every claim in flight, as SQL_LOCK_LIMITS does: a
    # claim that began before it saw no pause and would claim a job after `pause` returned.
    SQL_LOCK_PAUSED = "LOCK TABLE paused IN ACCESS EXCLUSIVE MODE"
    # A new limit waits for every claim in flight, and claims wait for it: a claim that began before the
    # limit saw none and took no lock, so a claim after it, counting only committed claims, would not
    # count that one. Every claim reads queue_limits, which holds off this lock until it commits.
    SQL_LOCK_LIMITS = "LOCK TABLE queue_limits IN ACCESS EXCLUSIVE MODE"
    # Taken by a migration before it looks for live workers: a registration under way commits first and is
    # seen, a later one waits for the migration and then meets the schema it brought (plain reads go on).
    SQL_LOCK_WORKERS = "LOCK TABLE workers IN EXCLUSIVE MODE"
    # Not a row without a version (an older worker the upgrade found dead): workers_versioned refuses its update,
    # and that worker, whose heartbeat it refuses too, would never read the request.
    SQL_REQUEST_STOP = "UPDATE workers SET stop_requested = 1 WHERE id = %s AND version IS NOT NULL"
    SQL_STATS_TIMES = ("SELECT ended_at - started_at, GREATEST(0, started_at - due_at) FROM runs "
                       "WHERE ended_at >= %s AND outcome IN ('completed', 'failed', 'dead')")
    SQL_RUN_TOTALS = ("SELECT count(*), coalesce(sum(round((ended_at - started_at) * 1000000)::bigint), 0), "
                      "(SELECT value FROM config WHERE key = 'runs_forgotten') FROM runs "
                      "WHERE outcome IN ('completed', 'failed', 'dead')")
    # Ready and staged together are every waiting job.
    SQL_OLDEST_ELIGIBLE_BY_QUEUE = (
        "SELECT queue, min(GREATEST(next_run_at, created_at)) FROM jobs "
        "WHERE state IN ('pending', 'failed') AND waiting_on = 0 "
        "AND next_run_at <= %s AND (NOT EXISTS (SELECT 1 FROM paused WHERE paused.queue IN (jobs.queue, '*')) "
        "OR EXISTS (SELECT 1 FROM paused WHERE paused.queue = '!' || jobs.queue)) GROUP BY queue")
    SQL_RUNS_PER_MINUTE = ("SELECT floor((ended_at - %s) / 60)::bigint AS minute, outcome, count(*) FROM runs "
                           "WHERE ended_at >= %s AND outcome IN ('completed', 'failed', 'dead') "
                           "GROUP BY minute, outcome")
    SQL_QUERY_ONLY = "SET default_transaction_read_only = on"

    # As SQLite's, without its INDEXED BY (PostgreSQL's planner takes jobs_claim for these probes).
    SQL_COMPLETE_QUEUES = """
        WITH RECURSIVE waiting(queue) AS (
            SELECT min(queue) FROM jobs WHERE state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1
            UNION ALL SELECT (SELECT min(queue) FROM jobs WHERE queue > waiting.queue
                AND state IN ('pending', 'failed') AND waiting_on = 0 AND ready = 1)
            FROM waiting WHERE waiting.queue IS NOT NULL)
        SELECT queue FROM waiting WHERE queue IS NOT NULL
        UNION SELECT queue FROM (SELECT queue FROM jobs ORDER BY seq DESC LIMIT %s) AS newest
        UNION SELECT queue FROM jobs WHERE state = 'processing'
        UNION SELECT queue FROM queue_limits UNION SELECT queue FROM paused"""
    # A transaction in pipeline mode (see PostgresStore._pipelined) is begun and ended by statements.
    SQL_BEGIN, SQL_COMMIT, SQL_ROLLBACK = "BEGIN", "COMMIT", "ROLLBACK"
    # Wake-ups: a transaction that makes a job due now notifies the queue's channel, and each worker
    # process listens on it (see PostgresStore.wait_notified). pg_notify inside the transaction is
    # delivered at its commit, and not at all if it rolls back.
    SQL_NOTIFY = "SELECT pg_notify(%s, '')"
    SQL_NOTIFY_SCHEDULES = f"SELECT pg_notify(%s, '{SCHEDULES_CHANGED}')"  # see Store._wake_for_schedules
    SQL_LISTEN = 'LISTEN "{channel}"'
    # A heartbeat in one statement (see PostgresStore.heartbeat): SharedSQL's SQL_HEARTBEAT and SQL_STOP_REQUESTED.
    SQL_BEAT = "UPDATE workers SET heartbeat_at = %s, beat = beat + 1 WHERE id = %s RETURNING stop_requested"
    # Schedules, as SQLite's. A due schedule is locked while it fires, and one that another worker
    # is firing is skipped (that worker fires it); a schedule read to change is read FOR UPDATE.
    SQL_NEXT_SCHEDULE = "SELECT min(next_run_at) FROM schedules WHERE paused = 0"
    SQL_DUE_SCHEDULES = (f"SELECT {Schedule.COLUMNS}, (SELECT state FROM jobs WHERE jobs.id = last_job_id) "
                         "FROM schedules WHERE paused = 0 AND next_run_at <= %s ORDER BY next_run_at "
                         "FOR UPDATE OF schedules SKIP LOCKED")
    SQL_SCHEDULE_TO_CHANGE = f"SELECT {Schedule.COLUMNS}, NULL FROM schedules WHERE id = %s FOR UPDATE"
    # As SQLite's, compared byte by byte (COLLATE "C"): the database's collation may order text otherwise.
    SQL_NEWEST_SLOT_JOB = ("SELECT max(id COLLATE \"C\") FROM jobs WHERE left(id, length(%(prefix)s)) = %(prefix)s "
                           "AND id COLLATE \"C\" < %(below)s AND substr(id, length(%(prefix)s) + 1) "
                           "~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$'")

    @staticmethod
    def id_array(ids: list[str]) -> list[str]:
        """Job ids as SQL_FORGET_RUNS takes them: a text[]."""
        return list(ids)


class _NotStreamed(Exception):
    """PostgresStore.enqueue_streamed cannot store this batch: the usual path takes it."""




@functools.lru_cache(maxsize=None)
def pg_prepared(sql: str) -> tuple[bytes, bytes, tuple[str, ...]]:
    """A statement of PostgresSQL as PgPipeline prepares it: (its name, its text with $1, $2… for its
    %s or %(name)s marks, the name of each $n: '' for a %s). The name is a digest of the text, so a
    name always means the same statement, whichever thread came first."""
    import hashlib
    marks: list[str] = []

    def number(mark: re.Match) -> str:
        if not mark[1] or mark[1] not in marks:
            marks.append(mark[1] or "")
        return f"${len(marks) if not mark[1] else marks.index(mark[1]) + 1}"
    text = PG_PARAM_MARK.sub(number, sql).encode()
    return b"queuectl_" + hashlib.blake2b(text, digest_size=8).hexdigest().encode(), text, tuple(marks)


class PgPipeline:
    """One transaction's statements sent straight through libpq in pipeline mode (psycopg's pgconn),
    for the statements a worker runs per job (see PostgresStore.finish_and_claim): psycopg's cursors,
    adapters and pipeline cost a worker far more CPU per job than these few calls do (DECISIONS.md).
    execute() sends a statement without waiting for the one before and returns its PgAnswer; the
    answer's fetchone() sends a sync and waits for it. Parameters go as text (bytes in binary), typed
    by the server from the statement; a statement is prepared on a connection the first time it runs
    there. The caller holds the connection's lock, and ends with finish() or abandon().

    No BEGIN or COMMIT is sent: the statements before a sync are one transaction (the implicit
    transaction of libpq's pipeline mode), which the sync commits, or an error rolls back. So an
    answer asked for in the middle of a transaction would end it: each caller asks only for answers
    to statements after which it would commit anyway."""

    SYNC = object()  # in `waiting`: the answer to a sync

    def __init__(self, store: "PostgresStore", conn):
        import select
        self.psycopg, self.pq, self.conn, self.pg = store.psycopg, store.psycopg.pq, conn, conn.pgconn
        self.encoding = conn.info.encoding
        if store.prepared[0] is not self.pg:  # a new connection: nothing prepared on it yet
            store.prepared = (self.pg, set())
        self.prepared = store.prepared[1]
        self.waiting: list = []  # what the server will answer, in order: PgAnswers, prepared names, SYNC
        self.unsynced = False  # statements sent since the last sync
        self.poller = select.poll()
        self.poller.register(self.pg.socket, select.POLLIN)
        self.pg.enter_pipeline_mode()

    def execute(self, sql: str, params: tuple | dict = ()) -> "PgAnswer":
        """Send one statement of PostgresSQL; its answer is read when asked for."""
        name, text, marks = pg_prepared(sql)
        if name not in self.prepared:
            self.pg.send_prepare(name, text)
            self.prepared.add(name)  # taken back if the server did not prepare it (see read)
            self.waiting.append(name)
            self.unsynced = True  # its answer comes only after a sync: see abandon
        values = [params[mark] for mark in marks] if isinstance(params, dict) else params
        self.pg.send_query_prepared(name, [self._dump(value) for value in values],
                                    [int(isinstance(value, bytes)) for value in values])  # 1: binary
        answer = PgAnswer(self)
        self.waiting.append(answer)
        self.unsynced = True
        return answer

    def _dump(self, value) -> bytes | None:
        """A parameter as libpq takes it: text, except bytes, which go as they are (in binary)."""
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode(self.encoding)
        if isinstance(value, list):  # of str: an array literal, every element quoted
            quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in value)
            return ("{" + ",".join(quoted) + "}").encode(self.encoding)
        return repr(value).encode()  # an int or a float: repr keeps every digit

    def read(self, until: "PgAnswer | None" = None) -> None:
        """Read answers in order up to `until`'s (all of them without it), syncing first if statements
        wait for one; a statement that failed raises its error (a psycopg.Error) when its answer is read."""
        if self.unsynced:
            self._sync()
        while self.waiting:
            entry = self.waiting.pop(0)
            result = self._next()
            if result is None:  # libpq has no answer where one is due: the connection cannot be trusted
                raise self.psycopg.OperationalError("the server's answers ended early")
            if entry is self.SYNC:
                continue
            self._next()  # the end of this statement's results
            if isinstance(entry, PgAnswer):
                entry.result = result
            elif result.status != self.pq.ExecStatus.COMMAND_OK:
                self.prepared.discard(entry)  # a prepare skipped after an error, or failed
            if result.status == self.pq.ExecStatus.FATAL_ERROR:
                raise self._error(result)
            if entry is until:
                return

    def finish(self) -> None:
        """Sync what is left, read every answer, and leave pipeline mode."""
        self.read()
        self.pg.exit_pipeline_mode()

    def abandon(self) -> None:
        """After an error: read what is left and leave pipeline mode, so the connection is as it was
        before. Statements sent but not synced are never synced (that would commit them): their
        connection is closed, which rolls them back, as is one that is lost or cannot be read; it is
        opened again at its next use (see PostgresStore._usable)."""
        try:
            if self.conn.closed or self.unsynced:
                raise ConnectionAbortedError
            while self.waiting:
                with contextlib.suppress(self.psycopg.DatabaseError):
                    self.read()
            self.pg.exit_pipeline_mode()
            if self.pg.transaction_status != self.pq.TransactionStatus.IDLE:
                raise ConnectionAbortedError
        except Exception:  # noqa: BLE001 - any: the connection is closed instead
            self.conn.close()

    def _sync(self) -> None:
        import select
        self.pg.pipeline_sync()
        self.waiting.append(self.SYNC)
        while self.pg.flush():  # a nonblocking connection: the rest goes when the socket takes it
            # poll, not select.select, which refuses a descriptor above 1023 (a worker with many runners)
            self.poller.modify(self.pg.socket, select.POLLIN | select.POLLOUT)
            self.poller.poll()
            self.pg.consume_input()
        self.poller.modify(self.pg.socket, select.POLLIN)
        self.unsynced = False  # only once all of it is sent: the server answers nothing before that

    def _next(self):
        """The next result, waiting for the server without holding the GIL."""
        while self.pg.is_busy():
            self.poller.poll()
            self.pg.consume_input()  # raises OperationalError if the connection is gone
        return self.pg.get_result()

    def _error(self, result) -> Exception:
        """The psycopg exception a cursor would have raised for this failed statement."""
        field = self.pq.DiagnosticField
        state = (result.error_field(field.SQLSTATE) or b"").decode()
        message = (result.error_field(field.MESSAGE_PRIMARY) or result.error_message or b"").decode(
            self.encoding, "replace")
        try:
            return self.psycopg.errors.lookup(state)(message)
        except KeyError:
            return self.psycopg.DatabaseError(message)


class PgAnswer:
    """One statement's answer in a PgPipeline, read the first time it is asked for."""
    LOADERS = {16: lambda value: value == b"t", 20: int, 21: int, 23: int, 700: float, 701: float}

    def __init__(self, pipeline: PgPipeline):
        self.pipeline, self.result = pipeline, None

    def fetchone(self) -> tuple | None:
        """The first row, its values loaded by column type (bool, integers, floats, else text)."""
        result = self._result()
        if not result.ntuples:
            return None
        row = []
        for column in range(result.nfields):
            value, load = result.get_value(0, column), self.LOADERS.get(result.ftype(column))
            row.append(value if value is None else load(value) if load else value.decode(self.pipeline.encoding))
        return tuple(row)

    def _result(self):
        if self.result is None:
            self.pipeline.read(self)
        return self.result


PG_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_]{1,63}")
PG_ATTEMPTS = 5  # tries of a transaction that a serialization failure or deadlock rolled back
PG_CONNECT_TIMEOUT_S = 10
PG_PEEK_CONNECT_TIMEOUT_S = 2  # a peek (a shell completion) soon gives up on a server that does not answer
PG_KEEPALIVE_PROBES = 3  # unanswered TCP keepalive probes before a worker's connection is given up
PG_COPY_MIN_ROWS = 100  # fewer jobs are inserted with executemany: COPY costs a round trip more


def is_postgres(target: str) -> bool:
    """Whether --db names a PostgreSQL database (a URL) rather than an SQLite file."""
    return target.startswith(("postgresql://", "postgres://"))


def _psycopg():
    """psycopg 3, imported on first use: only a PostgreSQL database needs it."""
    try:
        import psycopg
    except ImportError:
        raise BadDatabase('PostgreSQL needs psycopg 3: pip install "psycopg[binary]"') from None
    if tuple(int(part) for part in re.findall(r"\d+", psycopg.__version__)[:2]) < (3, 2):
        # 3.2 added the notifies(timeout=…) that the workers' wake-up listener waits with
        raise BadDatabase(f'PostgreSQL needs psycopg 3.2 or later (found {psycopg.__version__}): '
                          'pip install -U "psycopg[binary]"')
    import logging
    # psycopg logs, as a warning, the end of a pipeline that an error aborted ("error ignored
    # terminating <Pipeline …>") after the error itself was raised and handled (a duplicate id in a
    # batch): a command's failure is one line, and that line is ours.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    return psycopg


def pg_lease_params(stale_s: float) -> dict[str, int]:
    """libpq parameters of a worker whose lease is stale_s: a connection whose server vanished without
    a word (its host gone, packets dropped, no reset) fails within about stale_s/4, and the worker
    reconnects with backoff, instead of a read that waits until the kernel gives up (some 15 minutes
    with data unacknowledged, forever without). tcp_user_timeout bounds data the server does not
    acknowledge; keepalive probes, an answer that never comes. libpq counts keepalives and
    connect_timeout in whole seconds (psycopg waits at least 2 s to connect), so for a stale-timeout
    under about 8 s a hung connection takes 1-3 s to fail."""
    bound_s = stale_s / 4
    idle_s = max(1, int(bound_s / 2))
    return {"keepalives": 1, "keepalives_idle": idle_s,
            "keepalives_interval": max(1, int(bound_s / 2 / PG_KEEPALIVE_PROBES)),
            "keepalives_count": PG_KEEPALIVE_PROBES, "tcp_user_timeout": max(1, round(bound_s * 1000)),
            "connect_timeout": min(PG_CONNECT_TIMEOUT_S, max(2, math.ceil(bound_s)))}


def _pg_service_keys(service: str | None) -> set[str]:
    """The parameters a libpq service (pg_service.conf) sets: the user's choice as much as the URL's.
    libpq fills from it only what the connection string leaves out, so a value we pass would override
    it. Every file libpq may look in is read (more keys only means fewer of ours)."""
    import configparser
    if not service:
        return set()
    files = [os.environ.get("PGSERVICEFILE") or os.path.expanduser("~/.pg_service.conf"),
             os.path.join(os.environ.get("PGSYSCONFDIR") or "/etc/postgresql-common", "pg_service.conf")]
    keys = set()
    for name in files:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        with contextlib.suppress(OSError, configparser.Error, UnicodeDecodeError):
            parser.read(name)
            keys |= set(parser[service]) if parser.has_section(service) else set()
    return keys


def _pg_target(url: str) -> tuple[str, str, str, str]:
    """(URL for libpq without `schema`, schema, host:port, display name without the password)."""
    import getpass
    from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a bracket outside an IPv6 address, a port that is no number
        raise UsageError("the database URL is not a valid postgresql://USER@HOST:PORT/DBNAME URL") from None
    if parts.netloc.count("@") > 1:
        # libpq splits USER:PASSWORD@HOST at the first @, urlsplit at the last: each would take
        # part of the password for the host, and print it in its error
        raise UsageError("the database URL has more than one '@': write an '@' in the user or password as %40")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if [k for k, _ in query].count("schema") > 1:
        raise UsageError("the database URL names ?schema= more than once")
    schema = next((v for k, v in query if k == "schema"), "queuectl")
    if not PG_SCHEMA_NAME.fullmatch(schema):
        raise UsageError(f"schema {schema!r} in the database URL: use 1 to 63 letters, digits or underscores")
    port = port or parse_number(os.environ.get("PGPORT") or "5432", "$PGPORT", 0, 65535, integer=True)
    host = unquote(parts.hostname or "") or os.environ.get("PGHOST") or "localhost"
    host = f"[{host}]" if ":" in host else host
    user = unquote(parts.username or "") or os.environ.get("PGUSER") or getpass.getuser()
    dbname = unquote(parts.path.lstrip("/")) or os.environ.get("PGDATABASE") or user
    libpq = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "schema"])))
    return libpq, schema, f"{host}:{port}", f"postgresql://{user}@{host}:{port}/{dbname}?schema={schema}"


class PostgresStore(Store):
    """A Store in one schema of a PostgreSQL database: autocommit connection, explicit transactions.
    Timestamps come from the database server's clock (see now())."""
    sql = PostgresSQL
    notifies = True
    shared_by_hosts = True
    cut_off_kills = True

    def __init__(self, url: str, *, durable: bool = True, busy_deadline_s: float = CLI_BUSY_DEADLINE_S,
                 reads_only: bool = False, give_up=lambda: False, lease_s: float | None = None, peek: bool = False):
        """`url`: postgresql://USER[:PASSWORD]@HOST:PORT/DBNAME?schema=NAME; the password may instead
        come from PGPASSWORD or ~/.pgpass, as libpq finds it, and never appears in a message.
        `lease_s`: a worker's stale-timeout, which bounds how long its connection may hang (see set_lease).
        `peek`: as SqliteStore's (an older schema is refused, not upgraded), and a short connect_timeout."""
        self.psycopg = _psycopg()
        self.IntegrityError = self.psycopg.IntegrityError
        self.target = url  # what open_database() was given, to open more: may hold the password, never shown
        self._libpq, self.schema, self.server, self.path = _pg_target(url)
        # A channel name is at most 63 bytes: two long schema names may share one, which only costs
        # their workers a needless wake-up now and then.
        self.channel = f"queuectl_{self.schema}"[:63]
        self.listening = None  # the connection that LISTENs, once wait_notified() has been called
        self.pipeline = None  # the pipeline of the write() under way, if it is pipelined
        self.prepared = (None, set())  # (pgconn, names of the PgPipeline statements prepared on it)
        self.durable, self.reads_only, self.read_only, self.frozen = durable, reads_only or peek, False, False
        self.peek = peek
        self.busy_deadline_s, self.give_up = busy_deadline_s, give_up
        self.lease_s = self.conn_lease_s = lease_s  # the lease wanted, and the one the connection was opened for
        self.conn = self._connect()
        try:
            self._migrate()
            if self.reads_only and not self.peek:
                self.query_only()
        except BaseException:
            self.conn.close()
            raise

    # -- opening --------------------------------------------------------------------------------

    def _connect(self):
        try:
            lease_s = self.lease_s
            conn = self.psycopg.connect(self._libpq, autocommit=True, **self._connect_params(lease_s))
            self.conn_lease_s = lease_s
        except self.psycopg.Error as e:
            raise BadDatabase(f"cannot connect to PostgreSQL at {self.server}: {self._driver_message(e)}") from None
        try:
            # One round trip for the settings and the clock (pipeline mode: sent without waiting).
            with conn.pipeline():
                conn.execute(f'SET search_path TO "{self.schema}"')  # a validated identifier: see PG_SCHEMA_NAME
                # Workers need no durable commits: a lost write only means a job runs again
                # (at-least-once); an enqueue that printed its id must survive a crash of the server.
                conn.execute(f"SET synchronous_commit = {'on' if self.durable else 'off'}")
                # A statement waits for a lock at most as long as SQLite's busy wait; write() retries
                # until its deadline, so a table another session holds locked ends in Busy, and a hard
                # stop's give_up() is heard, instead of a statement that waits forever.
                conn.execute(f"SET lock_timeout = '{int(min(BUSY_TIMEOUT_S, self.busy_deadline_s) * 1000)}ms'")
                # queuectl never uses row-level security: with it off, a policy someone put on one of our
                # tables makes the statement fail instead of running the policy's functions as us.
                conn.execute("SET row_security = off")
                if self.peek:  # it never writes, not even to upgrade: read-only in this round trip, not one more
                    conn.execute(self.sql.SQL_QUERY_ONLY)
                before = time.time()
                server = conn.execute(self.sql.SQL_CLOCK).fetchone()[0]
            self.clock_offset_s = server - (before + time.time()) / 2
        except self.psycopg.Error as e:
            conn.close()
            raise BadDatabase(f"cannot use PostgreSQL at {self.server}: {self._driver_message(e)}") from None
        return conn

    def _connect_params(self, lease_s: float | None) -> dict:
        """Our libpq parameters, less those the user chose: one set in the URL (or connect_timeout in
        PGCONNECT_TIMEOUT) wins. A worker's connection gets pg_lease_params (see set_lease)."""
        ours = {"connect_timeout": PG_PEEK_CONNECT_TIMEOUT_S if self.peek else PG_CONNECT_TIMEOUT_S,
                **(pg_lease_params(lease_s) if lease_s else {})}
        url = self.psycopg.conninfo.conninfo_to_dict(self._libpq)
        given = set(url) | _pg_service_keys(url.get("service") or os.environ.get("PGSERVICE"))
        if os.environ.get("PGCONNECT_TIMEOUT"):
            given.add("connect_timeout")
        return {key: value for key, value in ours.items() if key not in given}

    def set_lease(self, stale_s: float) -> None:
        """Bound how long this worker's connection may hang, from its stale-timeout (pg_lease_params).
        A changed value reopens the connection at its next use."""
        self.lease_s = stale_s

    def _driver_message(self, error: Exception) -> str:
        """A driver error as one line without the password (libpq's messages do not hold it, but a
        message is never trusted to leave it out)."""
        text = " ".join((str(error).strip().splitlines() or [type(error).__name__])[0].split())
        text = re.sub(r"^connection failed: (connection to server at [^,]*, port \d+ failed: )?", "", text)
        password = self._password()
        return text.replace(password, "***") if password else text

    def _password(self) -> str:
        from urllib.parse import unquote, urlsplit
        return unquote(urlsplit(self._libpq).password or "") or os.environ.get("PGPASSWORD", "")

    def _migrate(self) -> None:
        """Check the schema is ours, then bring it up to date; safe against concurrent first uses.
        The owners first, from the catalog alone (SQL_OWNERS: its own round trip, since no statement
        that reads a relation of the schema may run before it); then a schema with queuectl's version
        table is ours, and one up to date needs no more (the identity check costs two more round trips)."""
        try:
            owners = self._owners(self.conn, not self.reads_only)
            if not any(table == "queuectl_version" for table, *_ in owners):
                version = self._version(self.conn)  # no schema, or not ours: see _version
            elif (version := self.conn.execute(self.sql.SQL_VERSION).fetchone()[0]) > SCHEMA_VERSION:
                raise self._too_new(version)
            if version == SCHEMA_VERSION:
                return
        except self.psycopg.Error as e:
            raise self._failure(e) from None
        if self.reads_only and version == 0:  # a reader never creates the schema nor fills an empty one
            raise NoQueue(f"no queue at {self.path} yet")
        if self.peek:
            raise BadDatabase(f"cannot read {self.path}: it needs a schema upgrade (version {version} to "
                              f"{SCHEMA_VERSION}), which a peek never makes")
        if self.reads_only:
            self._check_upgradable(owners, version)
        self.write(self._apply_migrations)

    def _check_upgradable(self, owners: list[tuple], version: int) -> None:
        """A reader whose role cannot upgrade the schema (it is another role's) is told who can, as a reader
        of a read-only SQLite file is, rather than warned off that role's schema as if it were to write there."""
        others = [(owner, user) for _, _, owner, ours, user, *_ in owners if not ours]
        if others:
            owner, user = others[0]
            raise BadDatabase(f"cannot read {self.path}: it needs a schema upgrade (version {version} to "
                              f"{SCHEMA_VERSION}) and {user} may not make it; its owner ({owner}), or a member of "
                              "that role, upgrades it by running any queuectl command that writes (such as enqueue "
                              "or config set)")

    def _owners(self, cur, writes: bool) -> list[tuple]:
        """SQL_OWNERS' rows; BadDatabase if one of our names is not a plain table of PostgreSQL's types (a
        view, or an operator of a column's type, would run its owner's code as whoever reads it), or, when
        `writes` or for a superuser, if the schema or one of its tables is owned by a role that is not ours,
        or if a role not ours may create objects in the schema: either could drop the jobs enqueued here,
        put in the commands our workers run, read the jobs' environments, or plant an operator our
        statements would call as us. A reader that is no superuser may read a queue others own (with
        SELECT): it trusts that owner (see README, "Owners")."""
        rows = cur.execute(self.sql.SQL_OWNERS, {"schema": self.schema, "tables": list(PG_TABLES)}).fetchall()
        for table, kind, owner, _, user, _, column, _, _, usage in rows:
            if not usage:  # the schema's row (e.g. a NOINHERIT member of its owner): said before any migration
                raise BadDatabase(f"{self.path}: {user} may not use schema {self.schema} (no USAGE: a member of "
                                  f"{owner} that does not inherit its privileges?): connect as a role that may, "
                                  f"or GRANT USAGE ON SCHEMA {self.schema}")
            if table is not None and kind != "r":
                raise BadDatabase(f"{self.path}: {self.schema}.{table} is {PG_RELKINDS.get(kind, 'no table')}, "
                                  "not a table: not queuectl's (name another schema with ?schema=)")
            if column is not None:
                raise BadDatabase(f"{self.path}: column {column} of {self.schema}.{table} has a type that is not "
                                  "PostgreSQL's own: not queuectl's (name another schema with ?schema=)")
        for table, _, owner, ours, user, superuser, _, creators, planted, _ in rows:
            if not (writes or superuser):
                continue
            what = f"table {self.schema}.{table}" if table else f"schema {self.schema}"
            if not ours:
                raise BadDatabase(f"{self.path}: {what} is owned by {owner}, not by {user} or a role {user} is a "
                                  f"member of, so {owner} could choose the commands your workers run and read your "
                                  f"jobs: use a schema of your own (?schema=), or make {user} a member of {owner} "
                                  f"(GRANT {owner} TO {user})" + (", and connect as that role, not a superuser"
                                                                  if superuser else ""))
            if creators:
                raise BadDatabase(f"{self.path}: {creators} may create objects in {what}, and so make queuectl's "
                                  f"statements run their code as {user}: REVOKE CREATE ON SCHEMA {self.schema} "
                                  f"FROM {creators}, or use a schema of your own (?schema=)")
            if planted:  # queuectl's own is jobs_dead: one a role not ours left may be what a statement calls
                raise BadDatabase(f"{self.path}: {what} holds {planted}, which queuectl's statements could call as "
                                  f"{user}: drop it, or use a schema of your own (?schema=)")
        return rows

    def _version(self, cur) -> int:
        """The schema's version (0: empty or absent); BadDatabase if it holds someone else's tables
        or was made by a newer queuectl."""
        tables, ours = cur.execute(self.sql.SQL_IDENTITY, (self.schema,)).fetchone()
        if tables and not ours:
            raise BadDatabase(f"{self.path}: schema {self.schema} holds tables that are not queuectl's "
                              "(name another with ?schema=)")
        version = cur.execute(self.sql.SQL_VERSION).fetchone()[0] if ours else 0
        if version > SCHEMA_VERSION:
            raise self._too_new(version)
        return version

    def _apply_migrations(self, cur) -> None:
        # Under the lock, read again: another process may have migrated while we waited.
        cur.execute(self.sql.SQL_MIGRATION_LOCK, (APPLICATION_ID, self.schema))
        # Before anything is read or written: tables put in someone else's schema would be theirs to rewrite.
        owners = self._owners(cur, True)
        if cur.execute(self.sql.SQL_SCHEMA_EXISTS, (self.schema,)).fetchone() is None:
            cur.execute(f'CREATE SCHEMA "{self.schema}"')
        elif all(table is None for table, *_ in owners):
            # A fresh schema: its tables will be its owner's. One that holds ours already is migrated as
            # current_user, who owns them or is a member of their owner (checked above): tables a member
            # made before owners were checked are that member's, and the team's role may not alter them.
            cur.execute(self.sql.SQL_AS_SCHEMA_OWNER, (self.schema,))
        version = self._version(cur)
        if 0 < version < SCHEMA_VERSION:  # nothing is written before this check (see SQL_LOCK_WORKERS)
            cur.execute(self.sql.SQL_LOCK_WORKERS)
            self.refuse_older_workers(cur, version, self.now())
        if not cur.execute(self.sql.SQL_IDENTITY, (self.schema,)).fetchone()[1]:
            cur.execute(self.sql.SQL_CREATE_VERSION)
            cur.execute(self.sql.SQL_INIT_VERSION)
        for number, script in enumerate(PG_MIGRATIONS[version:], start=version + 1):
            for statement in script if isinstance(script, list) else filter(str.strip, script.split(";")):
                cur.execute(statement)
            cur.execute(self.sql.SQL_SET_VERSION, (number,))

    def now(self) -> float:
        """The current time in Unix seconds on the database server's clock (this machine's clock
        plus the offset measured at connect), so hosts whose clocks disagree agree on due times."""
        return time.time() + self.clock_offset_s

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def query_only(self) -> None:
        """Make this connection refuse every write (a Store for a command or request that only reads)."""
        self.conn.execute(self.sql.SQL_QUERY_ONLY)

    def refresh(self) -> None:
        """Nothing to do: every read sees the latest commits."""

    # -- transactions ---------------------------------------------------------------------------

    def write(self, fn, *, pipelined: bool = False, direct: bool = False, single: bool = False):
        """Run fn(cursor) in one transaction; one that a serialization failure or a deadlock rolled
        back runs again (a few times, then Busy), and one that waited too long for a lock runs again
        until busy_deadline_s (then Busy). Other driver errors become one-line BadDatabase.
        `pipelined`: in psycopg's pipeline mode, where a statement is sent without waiting for the
        answer to the one before; a fetch waits for its answer, and fn calls self.pipeline.sync()
        where it needs a row count. `direct`: fn(PgPipeline), straight through libpq (see _direct).
        `single`: fn runs one statement, which is its own transaction (the connection autocommits):
        one round trip, where BEGIN and COMMIT around it would make three."""
        result = self._write_retrying(fn, pipelined, direct, single)
        self.committed = True
        return result

    def _write_retrying(self, fn, pipelined: bool, direct: bool, single: bool):
        import random
        errors = self.psycopg.errors
        deadline, conflicts = time.monotonic() + self.busy_deadline_s, 0
        while True:
            try:
                if direct:
                    return self._direct(fn)
                if single:
                    return fn(self._usable().cursor())
                if pipelined:
                    return self._pipelined(fn)
                with self._transaction() as conn:
                    return fn(conn.cursor())
            except (errors.SerializationFailure, errors.DeadlockDetected):
                conflicts += 1
                if conflicts == PG_ATTEMPTS or self.give_up():
                    raise Busy(f"database is busy: {self.path}: transactions kept conflicting; try again") from None
            except errors.LockNotAvailable:
                if time.monotonic() >= deadline or self.give_up():
                    raise Busy(f"database is busy: {self.path} stayed locked by another session; try again") from None
            except self.psycopg.Error as e:
                raise self._failure(e) from None
            time.sleep(random.uniform(0.005, 0.05) * (conflicts + 1))

    def _pipelined(self, fn):
        """fn(cursor) in one transaction in pipeline mode. BEGIN and COMMIT are sent as statements:
        conn.transaction() would wait for the answers before its COMMIT, one more round trip."""
        conn = self._usable()
        try:
            with conn.pipeline() as self.pipeline:
                cur = conn.cursor()
                cur.execute(self.sql.SQL_BEGIN)
                result = fn(cur)
                cur.execute(self.sql.SQL_COMMIT)
            return result
        except BaseException:
            # An error leaves the transaction open (aborted) on the server, unless the connection is gone.
            if not conn.closed and conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(self.psycopg.Error):
                    conn.execute(self.sql.SQL_ROLLBACK)
            self._close_if_in_transaction(conn)
            raise
        finally:
            self.pipeline = None

    @contextlib.contextmanager
    def _transaction(self):
        """psycopg's transaction on the usable connection, which it yields (see _close_if_in_transaction)."""
        conn = self._usable()
        try:
            with conn.transaction():
                yield conn
        except BaseException:
            self._close_if_in_transaction(conn)
            raise

    def _close_if_in_transaction(self, conn) -> None:
        """After a failed transaction: a connection whose ROLLBACK failed (psycopg only logs that) is still
        in it, and must not be used again. Its next transaction() would be a savepoint in it, reported done
        but never committed, and the next BEGIN only a warning, whose COMMIT would commit the half-done
        writes with its own. Closed, it is rolled back by the server; _usable opens another."""
        if not conn.closed and conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
            conn.close()

    def _direct(self, fn):
        """fn(pipeline), sent straight through libpq (see PgPipeline): the statements before a sync
        are one transaction, which an error rolls back."""
        conn = self._usable()
        with conn.lock:  # as psycopg's own calls take it: no other thread uses the connection meanwhile
            pipeline = PgPipeline(self, conn)
            try:
                result = fn(pipeline)
                pipeline.finish()
                return result
            except BaseException:
                pipeline.abandon()
                raise

    def read(self, sql: str, params: tuple | dict = ()) -> list[tuple]:
        """Run one read-only statement (its own snapshot)."""
        try:
            return self._usable().execute(sql, params).fetchall()
        except self.psycopg.Error as e:
            raise self._failure(e) from None

    def _usable(self):
        """The connection, opened again if the last one was lost (a server restart, a dropped link):
        a worker lives longer than any one connection."""
        if self.conn.closed or self.conn.broken or self.conn_lease_s != self.lease_s:
            self.conn.close()
            self.conn = self._connect()
            if self.reads_only:
                self.query_only()
        return self.conn

    def _failure(self, error: Exception) -> BadDatabase:
        return BadDatabase(f"database {self.path}: {self._driver_message(error)}")

    # -- the hooks of the rules -----------------------------------------------------------------

    def _wake_workers(self, cur) -> None:
        """Notify the listening workers when this transaction commits: a job is due now."""
        cur.execute(self.sql.SQL_NOTIFY, (self.channel,))

    def _wake_for_schedules(self, cur) -> None:
        """Notify the listening workers when this transaction commits: a schedule's next slot changed."""
        cur.execute(self.sql.SQL_NOTIFY_SCHEDULES, (self.channel,))

    def wait_notified(self, timeout_s: float) -> set[str]:
        """Wait up to timeout_s for wake-ups on this queue's channel; returns the payloads that came
        ("" for a job, SCHEDULES_CHANGED), none if none came. This Store's connection then serves only
        that. After (re)connecting, LISTEN and return both at once: a wake-up sent while we were not
        listening is lost, so the caller should look for work and schedules."""
        try:
            conn = self._usable()
            if conn is not self.listening:
                conn.execute(self.sql.SQL_LISTEN.format(channel=self.channel))
                self.listening = conn
                return {"", SCHEDULES_CHANGED}
            def drained() -> set[str]:  # what came with an earlier answer or waits on the socket, no waiting
                return {n.payload for n in conn.notifies(timeout=0)}
            heard = drained()
            if not heard:
                # Asleep on the socket until the server sends something: psycopg's own wait with a timeout
                # wakes ten times a second to look for a Ctrl+C, a third of an idle worker's CPU.
                import select
                poller = select.poll()  # not select.select, which refuses a descriptor above 1023
                poller.register(conn.fileno(), select.POLLIN)
                poller.poll(timeout_s * 1000)
                heard = drained()
            return heard
        except self.psycopg.Error as e:
            raise self._failure(e) from None

    def heartbeat(self, worker_id: str, now: float) -> bool | None:
        """Store.heartbeat in one statement, its own transaction: one round trip, not four (BEGIN, the update,
        the read, COMMIT) for the statement an idle worker sends most, every 2 s."""
        rows = self.write(lambda cur: cur.execute(self.sql.SQL_BEAT, (now, worker_id)).fetchall(), single=True)
        return bool(rows[0][0]) if rows else None

    def due_now(self, now: float, queues: tuple = ()) -> bool:
        """True if a claim now may find work: the poller's cheap check."""
        return self.read(self.sql.SQL_POLL, {"now": now, "queues": list(queues) or None})[0][0]

    def burst_done(self, now: float, queues: tuple = ()) -> bool:
        """True when nothing is processing (in these queues) and nothing is due within the burst horizon."""
        params = {"soon": now + BURST_HORIZON_S, "queues": list(queues)}
        if queues:
            busy = self.read(self.sql.SQL_ANY_PROCESSING_FROM_QUEUES, params)
            return not busy and not self.read(self.sql.SQL_DUE_SOON_FROM_QUEUES, params)[0][0]
        busy = self.read(self.sql.SQL_ANY_PROCESSING_ANY_QUEUE)
        return not busy and not self.read(self.sql.SQL_DUE_SOON_ANY_QUEUE, params)[0][0]

    def finish_and_claim(self, job: Job, worker_id: str, outcome: Outcome, settings: dict, now: float,
                         queues: tuple) -> tuple[Job | None, Job | None]:
        """Store.finish_and_claim, for a completed run in one round trip to the server instead of nine
        (each costs a wake-up of both sides, which on a busy machine is most of a short job's time):
        four statements sent together straight through libpq (see PgPipeline). Other outcomes take
        Store's path: a cancel may change them, and they are rarer."""
        rule = failure_rule(job, outcome, settings, now)
        if rule[0] != COMPLETED:
            return super().finish_and_claim(job, worker_id, outcome, settings, now, queues)
        ours, following, limited = self.write(
            lambda pipeline: self._complete_and_claim(pipeline, job, worker_id, outcome, rule, now, queues),
            direct=True)
        if limited:  # the best job is in a limited queue, whose claim needs its lock first: _claim_in's loop
            # The result is committed: a claim that fails now is the runner's next claim to retry, not
            # a reason to write the result again (which would find it no longer ours, and say so).
            with contextlib.suppress(QueueError):
                following = self.claim(worker_id, now, queues)
        return (_finished(job, COMPLETED, rule[1], rule[2], outcome, now) if ours else None), following

    def _complete_and_claim(self, pipeline: "PgPipeline", job: Job, worker_id: str, outcome: Outcome, rule: tuple,
                            now: float, queues: tuple) -> tuple[bool, Job | None, bool]:
        """(whether the job was still ours, the job claimed next, whether the claim needs a queue's lock):
        the job's lock, SQL_COMPLETE, then _claim_in's first two statements, as one transaction (libpq's
        implicit one: the statements before a sync). A job no longer ours gets nothing written, as in
        Store's path, and the claim goes ahead, as it does there. (The cancel flag is not read: a cancel never changes
        a completion.) The claim's answer is the only one waited for; the others come with it."""
        # The job's row is locked first, by a statement of its own: SQL_COMPLETE reads deps as of its
        # start, so an enqueue of a dependent that held this lock (SQL_JOB_STATE) and committed while
        # the completion waited for it would not be seen, and that dependent would wait forever.
        pipeline.execute(self.sql.SQL_JOB_STATE, (job.id,))
        completed = pipeline.execute(self.sql.SQL_COMPLETE, {
            "attempts": rule[1], "next_run_at": rule[2], "error": outcome.error, "exit_code": outcome.exit_code,
            "now": now, "id": job.id, "worker": worker_id, "run": job.run_count, "duration": outcome.duration_s,
            "output": outcome.output, "output_bytes": outcome.output_bytes, "channel": self.channel,
            "queue": job.queue})
        pipeline.execute(self.sql.SQL_PROMOTE, (now,))
        row = pipeline.execute(*self._claim_statement(worker_id, now, queues)).fetchone()
        ours = completed.fetchone()[0] == 1
        if row is None or row[1]:  # no due job; or claimed, unless our registration is gone
            return ours, _claimed(row), False
        return ours, None, True

    def _write_jobs(self, insert, specs: list[dict]) -> list[str]:
        """Store's; a few jobs without dependencies (a one-job enqueue) in pipeline mode: two round
        trips instead of six. (COPY cannot run in a pipeline, and a dependency's checks wait for
        answers anyway.)"""
        pipelined = len(specs) < PG_COPY_MIN_ROWS and not any(spec["depends_on"] for spec in specs)
        return self.write(insert, pipelined=pipelined)

    def _insert_rows(self, cur, rows: list[tuple]) -> None:
        """Store's, through COPY for more than a few rows: about three times executemany's rate.
        psycopg writes each row in COPY's text format, escaping tabs, newlines and backslashes."""
        if len(rows) < PG_COPY_MIN_ROWS:
            try:
                super()._insert_rows(cur, rows)
            except self.IntegrityError:
                # Raised while the rows were still being sent (psycopg reads the answers that came
                # meanwhile): the pipeline is aborted until a sync, so ROLLBACK TO could not run.
                if self.pipeline is not None:
                    with contextlib.suppress(self.psycopg.errors.PipelineAborted):
                        self.pipeline.sync()
                raise
            if self.pipeline is not None:
                self.pipeline.sync()  # a taken id raises here, where _insert_plain catches it
            return
        with cur.copy(self.sql.SQL_COPY_JOBS) as copy:
            for row in rows:
                copy.write_row(row)

    def enqueue_streamed(self, specs: Iterator[dict], now: float, check: Callable[[list[dict]], None],
                         stored: Callable[[int], None]) -> list[dict] | None:
        """Store's: one COPY fed as the jobs are validated, so the server inserts while we parse (on two
        cores, about as long as the slower of the two instead of their sum). `check(specs)` runs at the end,
        before the commit. Any failure (a job with dependencies, an invalid job, an id taken, a server error)
        rolls it all back and returns None: the caller's usual path then says what was wrong, exactly as it
        would have without this attempt. Returns the specs stored."""
        started = False

        def insert(cur) -> list[dict]:
            nonlocal started
            if started:  # write() runs fn again after a conflict: the specs are consumed, so give up
                raise _NotStreamed
            started, done = True, []
            with cur.copy(self.sql.SQL_COPY_JOBS) as copy:
                for spec in specs:
                    if spec["depends_on"]:
                        raise _NotStreamed  # its checks need queries, which cannot run during a COPY
                    copy.write_row(self._row(spec, 0, now))
                    done.append(spec)
                    if len(done) % INSERT_SLICE == 0:
                        stored(len(done))  # sent to the server; inserted there as it reads them
            check(done)
            stored(len(done))
            if done:  # due now or later (see Store.enqueue)
                self._wake_workers(cur)
            return done
        try:
            return self.write(insert)
        except Exception:  # noqa: BLE001 - any of them: the usual path reports it as it always did
            return None

    def _first_taken(self, cur, specs: list[dict]) -> dict:
        """Store's, in one statement: a batch of 100,000 jobs must not take 100,000 round trips to fail."""
        taken = {row[0] for row in cur.execute(self.sql.SQL_TAKEN_IDS, ([spec["id"] for spec in specs],))}
        return next(spec for spec in specs if spec["id"] in taken)

    def _claim_in(self, cur, worker_id: str, now: float, queues: tuple) -> Job | None:
        cur.execute(self.sql.SQL_PROMOTE, (now,))
        sql, params = self._claim_statement(worker_id, now, queues)
        while True:  # once, plus once more per limited queue whose lock it takes or finds taken
            row = cur.execute(sql, params).fetchone()
            if row is None or row[1]:  # no due job; or claimed, unless our registration is gone
                break
            # The best job is in a limited queue: lock it and look again, in a snapshot that sees every
            # claim of that queue. A claim holding one queue's lock only tries another's: no deadlock.
            lock = self.sql.SQL_TRY_LOCK_QUEUE if params["held"] else self.sql.SQL_LOCK_QUEUE
            params["held" if cur.execute(lock, (row[0],)).fetchone() else "busy"].append(row[0])
        return _claimed(row)

    def _claim_statement(self, worker_id: str, now: float, queues: tuple) -> tuple[str, dict]:
        """The claim statement for these queues, and its parameters before any queue's lock is taken."""
        params = {"worker": worker_id, "now": now, "queues": list(queues) or None, "held": [], "busy": []}
        return self.sql.SQL_CLAIM, params

    def flush_output(self, job: Job, tail: bytes, total: int) -> bool:
        """Store a running job's output so far (for `logs --follow`), in one short try that never
        waits for a lock (it is only worth a short delay); False if it did not. A worker calls it from a
        thread of its own (see Runner._flush): a connection that hangs here cannot delay a job's kill."""
        try:
            with self._transaction() as conn:
                conn.execute(self.sql.SQL_FLUSH_LOCK_TIMEOUT)
                conn.execute(self.sql.SQL_FLUSH_OUTPUT, (tail, total, job.id, job.run_count))
            return True
        except self.psycopg.Error:
            return False


def _claimed(row: tuple | None) -> Job | None:
    """The job a PostgreSQL claim statement took: its row is (best queue, free, the job's columns or NULLs)."""
    return None if row is None or row[2] is None else Job.from_row(row[2:])


class EmptyStore(SqliteStore):
    """An empty queue in memory, standing in for one that does not exist yet (NoQueue): what a command that
    only reads answers from, so looking never creates a file or a schema and prints what an empty queue would."""

    def __init__(self, target: str):
        super().__init__(target, reads_only=True)
        self.path = database_name(target)  # for messages; `target` stays the real one, to open it once it exists

    def _open_once(self) -> None:
        self.read_only, self.frozen, self.file_id, self.companion_ids = False, False, None, {}
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.write(self._apply_migrations)
        self.query_only()


def open_database(target: str, lease_s: float | None = None, **kwargs) -> Store:
    """The Store for --db: a PostgreSQL URL (postgresql:// or postgres://) or an SQLite file's path.
    `lease_s`: a worker's stale-timeout, which bounds how long its PostgreSQL connection may hang."""
    return PostgresStore(target, lease_s=lease_s, **kwargs) if is_postgres(target) else SqliteStore(target, **kwargs)


def database_name(target: str) -> str:
    """How messages name the database of `target` (a URL without its password)."""
    return _pg_target(target)[3] if is_postgres(target) else target


# ==== Process control ============================================================================
# Ending a run's processes wherever they went (kill_run), and the watchdog process that ends them
# when their worker dies without a chance to (Watchdog).
class Leftovers:
    """The processes of one run that were sent SIGKILL (pid -> start time, to tell when each is
    really gone), the sessions they led, and the first one that could not be killed, if any."""

    def __init__(self):
        self.killed: dict[int, str] = {}
        self.sessions: set[int] = set()
        self.stuck: str | None = None  # "cannot kill leftover process 4242 (sleep): permission denied"

    def gone(self) -> bool:
        """True once every killed process has exited (a zombie has: its files and locks are released).

        Judged by PID and start time, never by a readable environment: a SIGKILLed process's
        /proc/PID/environ reads empty at once, yet it keeps its open files and locks until its
        teardown ends, which takes a while for a large process (figures in DECISIONS.md).
        """
        return all(proc_start_time(pid) != start for pid, start in self.killed.items())


def kill_run(token: str, left: Leftovers | None = None) -> Leftovers:
    """SIGKILL every process of this run that `left` has not killed yet; does not wait for them.

    Each run's processes inherit QUEUECTL_RUN=token, so this finds the orphaned shell and its
    children exactly. A process in the middle of exec() has no readable environment for a moment
    (the kernel swaps its memory map first and fills the new one later), so a process is also
    taken when it is in the session of one that carries the token: every run starts its own
    session, a session id cannot be reused while a member lives, and a member can only be a
    descendant of the run. Repeated until a scan finds none, because a process may fork while we
    kill. (A job that clears its environment *and* calls setsid escapes this: a documented limit.)
    """
    left = Leftovers() if left is None else left
    if not token and not left.sessions:
        return left
    needle = f"QUEUECTL_RUN={token}\0".encode() if token else None
    ours = {None, 0, os.getsid(0)}  # never our own session (0: its leader is outside our PID namespace)
    for _ in range(50):
        found = {pid: start for pid in _pids()
                 if pid not in left.killed and (start := _run_member(pid, needle, left, ours))}
        for pid, start in found.items():
            left.killed[pid] = start
            error = _kill(pid, start)
            if error and left.stuck is None:
                left.stuck = f"cannot kill leftover process {pid} ({_read(f'/proc/{pid}/comm') or '?'}): {error}"
        if not found:
            break
    return left


def _run_member(pid: int, needle: bytes, left: Leftovers, ours: set) -> str | None:
    """The start time of `pid` if it belongs to the run, else None. The start time is read first,
    so it names the process whose environment was read."""
    start = proc_start_time(pid)
    if start is None:
        return None
    if needle and needle in (_environ(pid) or b""):
        left.sessions |= {_session(pid)} - ours
        return start
    return start if left.sessions and _session(pid) in left.sessions else None


def _kill(pid: int, start: str) -> str | None:
    """SIGKILL the process `pid` that started at `start`; returns why it could not be, if it could not.

    Through a pidfd opened after the scan and checked against the start time: a PID recycled
    between the scan and the kill is never signalled (Linux 5.3+; elsewhere a plain kill)."""
    import signal
    fd = _pidfd(pid)
    try:
        if proc_start_time(pid) != start:
            return None  # gone, or its PID now names another process
        if fd is None:
            os.kill(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        return None
    except ProcessLookupError:
        return None
    except PermissionError:  # a job that ran `sudo …` or a setuid helper, and a worker that is not root
        return "permission denied"
    except OSError as e:
        return e.strerror or str(e)
    finally:
        if fd is not None:
            os.close(fd)


def wait_gone(left: Leftovers, limit_s: float) -> bool:
    """Wait up to limit_s for every killed process to exit; returns whether they all did."""
    deadline = time.monotonic() + limit_s
    while not left.gone():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return []


def _session(pid: int) -> int | None:
    """The session id of a process (field 6 of /proc/PID/stat), or None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[3]) if fields else None


def _environ(pid: int) -> bytes | None:
    """The environment of a process, read through a live thread if its main thread has exited;
    None if it cannot be read at all (gone, or not ours)."""
    found = None
    others = [f"/proc/{pid}/task/{tid}/environ" for tid in _threads(pid) if tid != str(pid)]
    for path in [f"/proc/{pid}/environ", *others]:
        try:
            with open(path, "rb") as f:
                found = f.read() + b"\0"
        except OSError:
            continue
        if found != b"\0":
            break
    return found


class Watchdog:
    """The process that kills a PostgreSQL worker's runs when the worker dies by any means, SIGKILL
    included (there a lost run may rerun on another host, which cannot kill what is left of it here).

    Forked by the worker at its start (see Worker.run), in a session of its own, so neither the
    terminal's Ctrl+C nor a kill of the worker's process group reaches it. It holds the read end of a
    pipe whose write end only the worker holds (close-on-exec: no job inherits it). The worker writes
    the run's token just before it starts a job, the PID of the job's first process, which leads the
    run's session, with the token once started, and the PID and token again once it has reaped that
    process (the run is over). EOF means the worker is gone: the watchdog SIGKILLs the runs not over,
    by token and session (kill_run), a run whose start it was told of but not its PID by token
    alone, waits until they are gone, then exits. A worker that ends cleanly SIGKILLs its watchdog first.

    A sweeper on this host must not requeue the runs while processes the watchdog killed are still
    exiting: their environment already reads empty, so its token scan would miss them, yet they hold
    their files and locks until their teardown ends. So the watchdog holds a name for as long as it
    lives (see watchdog_at_work), and such a sweeper waits until the name is free.
    """

    current: "Watchdog | None" = None  # this worker process's, which _spawn tells of each job it starts

    def __init__(self, pid: int, write_end: int):
        import threading
        self.pid, self.write_end, self.alive = pid, write_end, True
        self.lock = threading.Lock()  # orders a runner's message against the close of the pipe at stop
        self.backlog: list[bytes] = []  # messages that found the pipe full, oldest first (see _send)
        self.overflowed = False  # has the backlog been full (said once)?

    @classmethod
    def start(cls, worker_id: str) -> "Watchdog | None":
        """Fork the watchdog of this worker process, which becomes Watchdog.current; None (and a
        warning) if no process can be had."""
        import fcntl  # noqa: F401 - loaded here for the child (see _watchdog_main)
        import socket
        import warnings
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        name = socket.socket(socket.AF_UNIX)  # close-on-exec, as every socket Python opens
        try:
            name.bind(_watchdog_name(worker_id))
            with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads: see below
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError as e:
            os.close(read_end)
            os.close(write_end)
            name.close()
            log.warning("cannot start the watchdog (%s): jobs get the parent-death signal instead", e,
                        extra=event("watchdog_failed", error=str(e)))
            return None
        if pid == 0:
            _watchdog_main(read_end, name.fileno())  # never returns
        os.close(read_end)
        name.close()  # the name stays taken while the watchdog holds its copy
        os.set_blocking(write_end, False)  # a runner never waits on the watchdog (see tell)
        cls.current = cls(pid, write_end)
        return cls.current

    def starting(self, token: bytes) -> None:
        """Tell of a run about to start, before its first process exists: a worker that dies between
        that start and tell() would otherwise leave the run to the next sweep."""
        if token:
            self._send(b"+%s\n" % token)

    def not_started(self, token: bytes) -> None:
        """Tell that the run announced by starting() did not start (no process carries its token)."""
        if token:
            self._send(b"!%s\n" % token)

    def tell(self, pid: int, token: bytes) -> None:
        """Tell of a job just started: its first process and its run's token. One write of one line
        (a token is printable ASCII), atomic (under PIPE_BUF) and never blocking: a message that
        finds the pipe full waits in the backlog (see _send)."""
        self._send(b"%d %s\n" % (pid, token))

    def ended(self, pid: int, token: bytes) -> None:
        """Tell that the run led by `pid` is over: we reaped its first process (see _watch). The token
        too, in case the message of its start found the pipe full and only starting() got through."""
        self._send(b"-%d %s\n" % (pid, token))

    def _send(self, message: bytes) -> None:
        """Write one message, after those still waiting. A message that finds the pipe full (a watchdog
        stopped or starved) waits in the backlog, in order, and goes with the next message or at the next
        housekeeping tick (check): a lost end of a run would have the watchdog kill that finished run's
        background children. Each message is one write under PIPE_BUF: whole or not at all."""
        with self.lock:
            if self.alive and len(self.backlog) < WATCHDOG_BACKLOG:
                self.backlog.append(message)
            elif self.alive and not self.overflowed:
                self.overflowed = True
                log.warning("the watchdog has not read its messages for a long time: from now on some are lost, and "
                            "a run's processes may be missed, or a finished one's background children killed, if "
                            "this worker dies", extra=event("watchdog_backlog_full"))
            self._flush()

    def _flush(self) -> None:
        """Send the backlog, oldest first, until the pipe is full (under self.lock)."""
        while self.backlog and self.alive:  # else stop() may have closed the descriptor, and its number be reused
            try:
                os.write(self.write_end, self.backlog[0])
            except BlockingIOError:
                return
            except OSError:  # EPIPE: the watchdog is gone; check() reaps it and says so
                self.alive = False
                return
            del self.backlog[0]

    def check(self) -> None:
        """At each housekeeping tick: send what waits in the backlog (see _send); if the watchdog died
        (someone killed it), reap it and warn once.
        Jobs started from then on get the parent-death signal instead (see _spawn); those already
        running are left to the token scan of a later sweep on this host."""
        with self.lock:
            self._flush()
        if self.pid is None or not _reaped(self.pid):
            return
        self.pid, self.alive = None, False
        log.warning("the watchdog process is gone: jobs started from now on get the parent-death signal "
                    "instead; those running now are left to the next sweep", extra=event("watchdog_lost"))

    def stop(self, clean: bool) -> None:
        """End the watchdog and reap it (waiting at most a few seconds). `clean`: SIGKILL it, so it
        kills nothing (it is our unreaped child: its PID cannot name another process); else close
        the pipe, and it kills the worker's runs as if the worker had died."""
        import signal
        if clean and self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)  # first: the EOF of the close below would set it killing
        with self.lock:
            if not clean:
                self._flush()  # what waits (the end of a finished run above all) before the EOF
            self.alive = False
            os.close(self.write_end)  # under the lock, with alive False: see tell
        if Watchdog.current is self:
            Watchdog.current = None
        deadline = time.monotonic() + HARD_STOP_S + 1.0  # it waits at most HARD_STOP_S for what it killed
        while self.pid is not None and not _reaped(self.pid):
            if time.monotonic() > deadline:
                log.warning("the watchdog process %d has not exited", self.pid, extra=event("watchdog_slow"))
                return
            time.sleep(0.005)
        self.pid = None


def _reaped(pid: int) -> bool:
    """Reap our child `pid` if it has exited; True if it has (or was reaped already)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _watchdog_name(worker_id: str) -> str:
    """The name a worker's watchdog holds while it lives: an abstract Unix socket address (Linux; it
    vanishes with the process), at most 108 bytes, and the tail of a worker id is its PID and random part."""
    return f"\0queuectl-watchdog/{worker_id[-80:]}"


def watchdog_at_work(worker_id: str) -> bool:
    """Is that worker's watchdog still alive on this host (and network namespace)? Asked of a worker of
    ours whose process is gone: until its watchdog has killed the worker's runs and seen them gone."""
    import errno
    import socket
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.bind(_watchdog_name(worker_id))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _watchdog_main(read_end: int, name: int) -> None:
    """The forked watchdog: wait for the worker's EOF, kill its runs, leave with os._exit.

    Forked before the worker's listener and runner threads start (the signal counter, blocked in
    poll(), holds no lock), so the child can run plain Python; it leaves with os._exit, which runs
    none of the worker's cleanup (its database connection is the worker's, not ours to close).
    """
    import fcntl  # both loaded before the fork: only looked up here
    import gc
    import signal
    # No garbage collection here: a file or socket object the worker left unreachable would be
    # finalized by it and close its descriptor's number, which may be our pipe's by then.
    gc.disable()
    try:
        with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
            f.write("qctl-watchdog")  # what ps -o comm and top show; named before it leads a session
        with contextlib.suppress(OSError, IndexError, ValueError):
            _rename_command_line(b"qctl-watchdog")
        os.setsid()  # out of the worker's session and process group: what kills those spares us
        # Keep the pipe and the name, at 3 or above (a worker started with stdin closed may have got
        # one as fd 0), close every other descriptor: the worker's log, pipes and database socket
        # must not be held open by us; 0-2 become /dev/null.
        reader, held = fcntl.fcntl(read_end, fcntl.F_DUPFD, 3), fcntl.fcntl(name, fcntl.F_DUPFD, 3)
        low, high = sorted((reader, held))
        for first, end in ((3, low), (low + 1, high), (high + 1, os.sysconf("SC_OPEN_MAX"))):
            os.closerange(first, end)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if null > 2:
            os.close(null)
        signal.set_wakeup_fd(-1)
        # Ignored, not defaulted: a signal meant for the worker that reaches us too (a `pkill -f` where
        # our command line could not be rewritten, a kill of PIDs picked from ps) must not leave the
        # worker's jobs unguarded. The worker ends us with SIGKILL.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _kill_runs(*_watch(reader))
    finally:
        os._exit(0)


def _rename_command_line(name: bytes) -> None:
    """Overwrite our argv in memory, so /proc/PID/cmdline (ps, pgrep -f, pkill -f) shows `name`. A fork
    of the worker carries its command line: `pkill -9 -f 'queuectl.*worker'` killed the worker and its
    watchdog together, and with them whatever would have killed the worker's jobs."""
    fields = _stat_fields(os.getpid())
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 (proc(5))
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        mem.write(name[:end - start - 1].ljust(end - start, b"\0"))


def _watch(fd: int) -> tuple[dict[int, tuple[str | None, bytes]], set[bytes]]:
    """Read the worker's messages until EOF; returns the runs it told of and has not told over
    (leader PID -> (its start time if it was still running when told, which tells a recycled PID
    apart, and the run's token)), and the tokens of the runs it was starting and never told the
    first process of (the worker died in between: that process may run all the same).

    A run is over when the worker has reaped its first process (`-PID`), not when that process is
    gone: one that dies of the worker's death (SIGPIPE on its output, which only the worker read) is
    reaped at once by whoever adopts orphans, and its run was never over."""
    told, starting, rest = {}, set(), b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return told, starting
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            with contextlib.suppress(ValueError):  # never ours to send, but a bad line must not end us
                if line.startswith(b"+"):  # about to start
                    starting.add(line[1:])
                elif line.startswith(b"!"):  # did not start
                    starting.discard(line[1:])
                elif line.startswith(b"-"):  # over
                    pid, _, token = line[1:].partition(b" ")
                    starting.discard(token)
                    if told.get(int(pid), (None, None))[1] == token:  # not a later run that got the PID
                        del told[int(pid)]
                else:  # started
                    pid, _, token = line.partition(b" ")
                    starting.discard(token)
                    told[int(pid)] = (_told_start(int(pid)), token)  # None: ended already, only its token left
        # Read in batches: woken for each job, this process would add to every short job's CPU (figures in
        # DECISIONS.md). To act 20 ms later changes nothing: a rerun elsewhere waits for stale-timeout.
        time.sleep(0.02)


def _told_start(pid: int) -> str | None:
    """The start time of the job's first process `pid` we were just told of, if it still runs. It is
    our parent's child (the worker's; once the worker is gone, both of us were adopted by the same
    reaper) until it has exited and been reaped: a PID with another parent now names another process
    (read late, after the job ended and the PID came round again), which we must never kill."""
    parents = {os.getppid()}  # before and after the read: the worker may die in between
    fields = _stat_fields(pid)
    parents.add(os.getppid())
    if not fields or int(fields[1]) not in parents:
        return None
    return fields[19] if fields[0] not in ("Z", "X") else proc_start_time(pid)  # one read, but for a zombie


def _kill_runs(told: dict[int, tuple[str | None, bytes]], starting: set[bytes] = frozenset()) -> None:
    """SIGKILL the runs still in progress (told of, not told over): by their exact token, and by their
    session where its leader is still the process told of (a zombie too: its session may have
    members); a run told of as starting only, by its token (a process found by it gives the session).
    A run the worker saw end is over: a background child it left is neither waited for nor killed,
    as everywhere (the README's rule), so no scan of the worker's token prefix."""
    left = Leftovers()
    left.sessions |= {pid for pid, (start, _) in told.items()
                      if start and (fields := _stat_fields(pid)) and fields[19] == start}
    tokens = [token for _, token in told.values()] + sorted(starting)
    for _ in range(2):  # once more a moment later: a child between fork and exec has no token to read yet
        for token in tokens:
            kill_run(token.decode(errors="replace"), left)
        time.sleep(0.05)
    wait_gone(left, HARD_STOP_S)  # then our name is freed, and a sweeper here may requeue the runs


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# ==== Execution ==================================================================================

def run_command(job: Job, env_extra: dict, abort, on_output=None, *, die_with_worker: bool = False,
                keep_bytes: int = OUTPUT_TAIL_BYTES, kill_grace=lambda: 0, stdin: bytes | None = None) -> Outcome:
    """Run a job's command in its own session; keep the last `keep_bytes` of its output (output-limit).

    `abort()` is polled while the command runs; when it returns a reason the process group is
    killed and the outcome is marked interrupted. `on_output(tail, total)` is called at most every
    OUTPUT_FLUSH_S while a long job prints, so its output can be followed live. `die_with_worker`:
    see _die_with_worker. `kill_grace()`: the seconds a timed-out or canceled run gets between
    SIGTERM and SIGKILL (see _Capture.stop). `stdin`: what the command reads (None: /dev/null).
    """
    started = time.monotonic()
    # Asked before the start too: the claim or the settings read before it may have answered only after
    # the worker was cut off (a server that hung meanwhile), when another host may already be rerunning
    # the job; then no process of it may run here, not even until the first look below.
    reason = abort()
    if reason:
        return _outcome(None, reason, b"", 0.0, job.timeout)
    extra = {k.encode(): v.encode() for d in (job.env, env_extra) for k, v in d.items()}
    try:
        proc = _spawn(job, extra, die_with_worker, stdin)
    except OSError as e:
        error = f"cannot start: {e.strerror}: {job.cwd}" if isinstance(e, FileNotFoundError) else f"cannot start: {e}"
        return Outcome(None, error, b"", time.monotonic() - started)
    capture = _Capture(proc, started, on_output, keep_bytes)
    reason, ended = capture.collect(job.timeout, abort, kill_grace)
    stuck = end_run(proc, env_extra.get("QUEUECTL_RUN", "")) if reason else None
    if die_with_worker and Watchdog.current and proc.returncode is not None:
        # reaped by us: the run is over, its background children are not ours
        Watchdog.current.ended(proc.pid, env_extra.get("QUEUECTL_RUN", "").encode())
    proc.stdout.close()
    outcome = _outcome(proc.returncode, reason, bytes(capture.tail), time.monotonic() - started, job.timeout, ended)
    outcome.output_bytes, outcome.stuck = capture.total, stuck
    return outcome


def end_run(proc, token: str) -> str | None:
    """Kill what is left of a run the worker interrupted and wait (bounded) until it is gone; returns
    why a process of it could not be killed, if one could not (the run must then not be rerun).

    The group was sent SIGKILL; this also takes children that left it with setsid (by token) and
    members of the run's session whose environment we may not read (a setuid program), found
    through the session id, which is the leader's PID: safe to use while the leader is not reaped,
    since a PID that is still a session id is never given to a new process.
    """
    left = Leftovers()
    left.sessions.add(proc.pid)
    kill_run(token, left)
    with contextlib.suppress(Exception):
        proc.wait(0 if left.stuck else 5.0)
    if left.stuck is None and proc.returncode is None:
        left.stuck = f"cannot kill process {proc.pid} ({_read(f'/proc/{proc.pid}/comm') or '?'}): it does not exit"
    if left.stuck:
        log.warning("%s", left.stuck, extra=event("kill_failed", run=token, error=left.stuck))
    elif not wait_gone(left, 5.0):
        log.warning("some killed processes of run %s are still exiting", token, extra=event("kill_slow", run=token))
    return left.stuck


def _spawn(job: Job, extra: dict, die_with_worker: bool, stdin: bytes | None = None):
    """Start the command: exec'd directly when it is plain words, else through `/bin/sh -c`.
    Its environment is the worker's with `extra` (the job's env and QUEUECTL_* variables) on top."""
    import subprocess
    watchdog = Watchdog.current if die_with_worker else None
    if watchdog and watchdog.alive:  # it kills the run if the worker dies: start the job as on SQLite
        return _spawn_watched(job, extra, watchdog, stdin)
    if stdin is not None:  # a notification job (rare): its input in a file, so no thread must feed a pipe
        import tempfile
        with tempfile.TemporaryFile() as file:
            file.write(stdin)
            file.seek(0)
            return _spawn_with(job, extra, die_with_worker, file)
    return _spawn_with(job, extra, die_with_worker, subprocess.DEVNULL)


def _spawn_with(job: Job, extra: dict, die_with_worker: bool, stdin):
    """_spawn's start, stdin from `stdin` (a file, or subprocess.DEVNULL: the only one posix_spawn is given)."""
    import subprocess
    # start_new_session: the job gets its own process group, so the terminal's Ctrl+C meant for
    # the worker never reaches it, and killpg() reaches all of its children.
    options = dict(cwd=job.cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   start_new_session=True)
    # Jobs that must die with their worker and have no watchdog to see to it (see Watchdog) are
    # started with a preexec_fn (see _die_with_worker), a slower fork: only after the watchdog died.
    # Other jobs are spawned with posix_spawn where it can (see _posix_spawn).
    if die_with_worker:
        options["preexec_fn"] = _die_with_worker()
    plain = not die_with_worker and stdin is subprocess.DEVNULL
    start = _posix_spawn if plain and _in_current_folder(job.cwd) else None
    base = _worker_env()
    path = extra.get(b"PATH", base.get(b"PATH"))
    direct = direct_argv(job.command, job.cwd, {} if path is None else {b"PATH": path})
    if direct:
        direct_extra = {**extra, b"PWD": _shell_pwd(job.cwd, extra.get(b"PWD", base.get(b"PWD", b"")))}
        try:
            if start:
                return start(direct[0], direct[1], direct_extra)
            return subprocess.Popen(direct[1], executable=direct[0], env={**base, **direct_extra}, **options)
        except OSError:
            pass  # e.g. a script without #!: the shell knows what to do (run it as a shell script)
    if start:
        return start(b"/bin/sh", ["/bin/sh", "-c", job.command], extra)
    return subprocess.Popen(["/bin/sh", "-c", job.command], env={**base, **extra}, **options)


def _spawn_watched(job: Job, extra: dict, watchdog: "Watchdog", stdin: bytes | None):
    """Start the job as on SQLite, its watchdog told of the run's token first: a worker killed after the
    job's first process exists and before tell() (milliseconds on a busy host: this thread must get
    the GIL back) still has its run killed, by token (see Watchdog)."""
    token = extra.get(b"QUEUECTL_RUN", b"")
    watchdog.starting(token)
    try:
        proc = _spawn(job, extra, False, stdin)
    except BaseException:
        watchdog.not_started(token)
        raise
    watchdog.tell(proc.pid, token)
    return proc


def _in_current_folder(cwd: str) -> bool:
    """Is the job's folder the worker's own (the same directory, not only the same name)? Then the
    job can be started without a chdir, which Python 3.11's os.posix_spawn cannot do. Asked for
    every job (a folder replaced since the last job must get Popen's chdir into the new one)."""
    try:
        here, there = os.stat("."), os.stat(cwd)
    except OSError:
        return False  # Popen's chdir reports it as before
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _posix_spawn(program: bytes, argv: list[str], extra: dict) -> "_Spawned":
    """Start a job as Popen would with our options, through posix_spawn (glibc's with the GIL released
    where it can, see _GlibcSpawn; else os.posix_spawn): half the worker's CPU per start (no
    Python-side fork bookkeeping), the same session, signals, input and output.

    Only where the job needs no chdir (see _in_current_folder) and no preexec_fn (the parent-death
    signal on PostgreSQL): Popen does those. Popen's close_fds has no equal here, so descriptors the
    worker inherited from whoever started it are made close-on-exec first (everything Python and SQLite
    open already is); SIGPIPE and SIGXFSZ go back to their defaults as with Popen's restore_signals.
    """
    _no_inherited_fds()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        spawn = _glibc_spawn()
        pid = (spawn or _os_spawn)(program, argv, extra, write_end)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return _Spawned(pid, _PipeEnd(read_end))


class _PipeEnd:
    """The read end of a job's output pipe, as much of a file as running a job uses (the descriptor,
    close): a file object costs an fstat and an allocation per job, and _Capture reads with os.read."""

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _os_spawn(program: bytes, argv: list[str], extra: dict, write_end: int) -> int:
    """os.posix_spawn with the job's process settings (see _posix_spawn), in the worker's environment
    with `extra` on top. It holds the GIL until the child has exec'd: the other runner thread stands
    still meanwhile (see _GlibcSpawn)."""
    import signal
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, write_end, 1), (os.POSIX_SPAWN_DUP2, write_end, 2)]
    return os.posix_spawn(program, argv, {**_worker_env(), **extra}, file_actions=actions, setsid=True,
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))


@functools.cache
def on_glibc() -> bool:
    """Is this Linux with glibc, whose functions queuectl calls through ctypes where they pay?"""
    try:
        return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (OSError, ValueError):
        return False


@functools.cache
def _glibc_spawn() -> "_GlibcSpawn | None":
    """glibc's posix_spawn through ctypes, set up once; None elsewhere (then os.posix_spawn)."""
    try:
        if not on_glibc():
            return None
        import ctypes
        return _GlibcSpawn(ctypes)
    except (ImportError, OSError, AttributeError, ValueError):
        return None


class _GlibcSpawn:
    """The same call as _os_spawn, to the same libc function, but through ctypes, which releases the
    GIL for the call: os.posix_spawn keeps it while the child is created and exec's (glibc's spawn
    waits for the exec), so on a busy machine the other runner thread could run no Python until the
    new child got a CPU: a large share of a runner's time per tiny job (figures in DECISIONS.md).

    The attributes (new session, SIGPIPE and SIGXFSZ back to their defaults) are set once and only
    read by posix_spawn. So are the file actions of each descriptor number the output pipe gets (a
    handful: numbers are reused), and the C array of the worker's environment (all but the job's own
    variables): converting them to C strings for every job would cost more than the rest of the
    spawn's Python (DECISIONS.md). posix_spawn only reads what it is given, so threads share all of it.
    Flag values are glibc's <spawn.h>."""

    SETSIGDEF, SETSID = 0x04, 0x80  # POSIX_SPAWN_SETSIGDEF, POSIX_SPAWN_SETSID

    def __init__(self, ctypes):
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        self.ctypes, self.libc = ctypes, libc
        self.attr = ctypes.create_string_buffer(1024)  # posix_spawnattr_t: 336 bytes on x86-64 glibc
        defaults = ctypes.create_string_buffer(1024)  # sigset_t: 128 bytes
        steps = [libc.posix_spawnattr_init(self.attr), libc.sigemptyset(defaults),
                 libc.sigaddset(defaults, signal.SIGPIPE), libc.sigaddset(defaults, signal.SIGXFSZ),
                 libc.posix_spawnattr_setsigdefault(self.attr, defaults),
                 libc.posix_spawnattr_setflags(self.attr, ctypes.c_short(self.SETSIGDEF | self.SETSID))]
        if any(steps):
            raise OSError("posix_spawn attributes refused")
        self.actions: dict[int, object] = {}  # output pipe's descriptor -> file actions
        self.environs: dict[frozenset, tuple] = {}  # names the job sets -> (worker env, C array of the rest)

    def __call__(self, program: bytes, argv: list[str], extra: dict, write_end: int) -> int:
        """Spawn `program` in the worker's environment with `extra` on top (see _os_spawn)."""
        c = self.ctypes
        args = [os.fsencode(a) for a in argv]
        added = [k + b"=" + v for k, v in extra.items()]
        if b"\0" in b"".join(args) + b"".join(added) or b"=" in b"\0".join(extra):  # as one string: a loop is slower
            return _os_spawn(program, argv, extra, write_end)  # it raises the error it always did
        inherited = self._environ(extra)
        envp = (c.c_char_p * (len(inherited) + len(added) + 1))()
        c.memmove(envp, inherited, c.sizeof(inherited))  # pointers into strings `inherited` keeps alive
        envp[len(inherited):len(inherited) + len(added)] = added
        actions, pid = self._actions(write_end), c.c_int()
        try:
            failed = self.libc.posix_spawn(c.byref(pid), program, actions, self.attr,
                                           (c.c_char_p * (len(args) + 1))(*args), envp)
        finally:
            if write_end not in self.actions:
                self.libc.posix_spawn_file_actions_destroy(actions)
        if failed:
            raise OSError(failed, os.strerror(failed), program)
        return pid.value

    def _environ(self, extra: dict):
        """The C array of the worker's environment without the names `extra` sets, built once per set
        of names (and again if the environment changed: tests replace it)."""
        worker, names = _worker_env(), frozenset(extra)
        hit = self.environs.get(names)
        if hit is None or hit[0] != worker:
            entries = [k + b"=" + v for k, v in worker.items() if k not in names]
            if len(self.environs) >= 64:
                self.environs.clear()
            hit = self.environs[names] = (dict(worker), (self.ctypes.c_char_p * len(entries))(*entries))
        return hit[1]

    def _actions(self, write_end: int):
        """stdin from /dev/null, stdout and stderr to the pipe: kept per descriptor number (at most 256;
        beyond, built for the call and destroyed after it)."""
        actions = self.actions.get(write_end)
        if actions is None:
            c, libc = self.ctypes, self.libc
            actions = c.create_string_buffer(256)  # posix_spawn_file_actions_t: 80 bytes
            libc.posix_spawn_file_actions_init(actions)
            failed = libc.posix_spawn_file_actions_addopen(actions, 0, b"/dev/null", os.O_RDONLY, 0) or \
                libc.posix_spawn_file_actions_adddup2(actions, write_end, 1) or \
                libc.posix_spawn_file_actions_adddup2(actions, write_end, 2)
            if failed:  # these return the error number (ENOMEM, EBADF)
                libc.posix_spawn_file_actions_destroy(actions)
                raise OSError(failed, os.strerror(failed))
            if len(self.actions) < 256:
                self.actions[write_end] = actions
        return actions


@functools.cache
def _no_inherited_fds() -> None:
    """Make every inheritable descriptor above 2 close-on-exec, once per worker (see _posix_spawn)."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else range(3, 256):
        fd = int(name)
        with contextlib.suppress(OSError):
            if fd > 2 and os.get_inheritable(fd):
                os.set_inheritable(fd, False)


class _Spawned:
    """The part of subprocess.Popen that running a job uses, for a process os.posix_spawn started."""

    def __init__(self, pid: int, stdout):
        self.pid, self.stdout, self.returncode = pid, stdout, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0  # reaped elsewhere: as Popen does, count it as exit 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Like Popen.wait: subprocess.TimeoutExpired if it has not exited within timeout seconds."""
        deadline, delay = None if timeout is None else time.monotonic() + timeout, 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal
        self.send_signal(signal.SIGKILL)


def _die_with_worker():
    """A preexec_fn that makes the job's first process get SIGKILL when the thread that forked it
    ends (prctl PR_SET_PDEATHSIG), so a worker killed with SIGKILL takes its jobs' shells with it at
    once; None where there is no prctl (not Linux).

    The signal follows the *thread*, not the process: jobs are started by runner threads, which
    live as long as the worker process (one only leaves when its job has ended and the worker is
    stopping). It survives exec, except of a setuid or setgid program. Processes the job starts
    do not inherit it: those are found by their run's token at the next sweep on this host (see
    kill_run). preexec_fn costs Python's fast (vfork) spawn, so prctl is looked up here, before
    the fork, and the child only calls it.

    Only where workers share a queue across hosts (PostgreSQL): there a lost run may be rerun on
    another host, which cannot kill what is left of it here. With SQLite every worker is on this
    host and the next sweep kills the run's leftovers by token before anything reruns it, while a
    full fork per job slows the drain of short jobs several times over (figures in DECISIONS.md).
    """
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, SIGKILL)
        if os.getppid() != parent:  # the worker died before prctl: nothing would signal us now
            os.kill(os.getpid(), SIGKILL)
    return set_parent_death_signal


@functools.cache
def _prctl():
    """libc's prctl through ctypes, or None."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    except (ImportError, OSError, AttributeError):
        return None


def direct_argv(command: str, cwd: str, env: dict) -> tuple[str, list[str]] | None:
    """(program, argv) when `sh -c command` would just exec argv; None when a shell is needed.

    As make does: a command of plain words (no quotes, expansions, globs, redirections, operators
    or assignments) whose program is found on PATH means the same to sh as to execve, and skipping
    sh saves most of a short job's cost. Anything else, including a program sh would not find
    (sh prints the error and exits 127), goes through the shell.
    """
    if not PLAIN_COMMAND.fullmatch(command):
        return None
    argv = command.split()
    if argv[0] in SHELL_WORDS and argv not in (["true"], ["false"]):
        return None  # builtins and keywords: the shell's own meaning
    if b"PATH" not in env:
        return None  # sh has its own default path
    # PATH stays bytes: the environment is bytes, and a folder name need not be UTF-8 (/opt/caf\xe9).
    program = _find_program(argv[0], cwd, env[b"PATH"])
    return (program, argv) if program else None


def _find_program(name: str, cwd: str, path: bytes) -> bytes | None:
    """What sh would execute for `name`: a path with a slash as is, else the first hit on PATH.

    Remembered for a second (a long PATH costs a dozen stat calls a job); a program removed within
    that second fails to start and falls back to the shell, which reports it as sh would."""
    key, now = (name, cwd, path), time.monotonic()
    hit = _PROGRAMS.get(key)
    if hit and now - hit[1] < 1.0:
        return hit[0]
    program = _search_program(name, cwd, path)
    if len(_PROGRAMS) >= 1024:
        _PROGRAMS.clear()
    _PROGRAMS[key] = (program, now)
    return program


_PROGRAMS: dict[tuple, tuple] = {}


def _search_program(name: str, cwd: str, path: bytes) -> bytes | None:
    name_b, cwd_b = os.fsencode(name), os.fsencode(cwd)
    dirs = [b""] if "/" in name else path.split(b":")
    for folder in dirs:
        relative = not os.path.isabs(folder)
        candidate = os.path.join(cwd_b, folder or b".", name_b) if relative else os.path.join(folder, name_b)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _shell_pwd(cwd: str, inherited: bytes) -> bytes:
    """$PWD as dash exports it: the inherited value if it names the job's folder, else the real path.
    The same name needs no stat of either (two a job): a folder gone since is no job's to start."""
    try:
        if inherited.startswith(b"/") and (inherited == os.fsencode(cwd) or os.path.samefile(inherited, cwd)):
            return inherited
    except OSError:
        pass
    return os.path.realpath(cwd).encode()


_ENV: dict[bytes, bytes] = {}


def _worker_env() -> dict[bytes, bytes]:
    """The worker's own environment as bytes, copied once: re-encoding it for every job costs more
    than the rest of the job's bookkeeping."""
    if not _ENV:
        _ENV.update(os.environb)
    return _ENV


class _Capture:
    """Reads a running job's output pipe into a bounded tail, waking on output or on exit."""

    def __init__(self, proc, started: float, on_output, keep_bytes: int):
        import select
        self.proc, self.started, self.on_output, self.keep_bytes = proc, started, on_output, keep_bytes
        self.fd = proc.stdout.fileno()
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN | select.POLLHUP)
        # A pidfd becomes readable when the shell exits, so we learn of the exit at once instead of
        # sleeping in short steps after EOF (Linux 5.3+; elsewhere we fall back to those steps). It is
        # opened only for a job still running after QUICK_JOB_S or after its EOF: a short job ends
        # with its output's EOF and has exited by the time we look, and costs two syscalls less.
        self.pidfd, self.watching = None, False
        self.tail, self.total, self.eof = bytearray(), 0, False
        self.flushed_at, self.flushed_total = started, 0

    def collect(self, timeout_s: float, abort, kill_grace) -> tuple[str | None, str | None]:
        """Read until the shell exits, a timeout or an abort; returns why it was interrupted, if it was,
        and how it ended then (see stop)."""
        try:
            return self._loop(timeout_s, abort, kill_grace)
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)

    def _loop(self, timeout_s: float, abort, kill_grace) -> tuple[str | None, str | None]:
        waited = False  # a process started a moment ago has not exited: the first look is at its output
        while True:
            reason = "timeout" if timeout_s and time.monotonic() - self.started > timeout_s else abort()
            if reason:
                return reason, self.stop(reason, abort, kill_grace() if reason in SOFT_STOPS else 0)
            if waited and self.proc.poll() is not None:
                self._drain()
                return None, None
            waited = True
            if not self.watching and (self.eof or time.monotonic() - self.started >= QUICK_JOB_S):
                self._watch_exit()
            if self.eof and self.pidfd is None:
                _wait_a_little(self.proc)  # output closed, shell still running
            elif any(fd == self.fd for fd, _ in self.poller.poll(250 if self.watching else QUICK_JOB_S * 1000)):
                self._read()
            self._maybe_flush()

    def _watch_exit(self) -> None:
        import select
        self.watching, self.pidfd = True, _pidfd(self.proc.pid)
        if self.pidfd is not None:
            self.poller.register(self.pidfd, select.POLLIN)

    def stop(self, reason: str, abort, grace_s: float) -> str | None:
        """End the run's process group (not reaped here: see end_run) and return how, for last_error.

        With a grace, SIGTERM first, and SIGKILL once the grace is over if any process of the group
        is still there ("killed after 10s grace"), else "terminated". Meanwhile its output is still
        read and the worker still heartbeats; a hard reason to abort (a hard stop, a lost
        registration, a cut-off from the database) ends the grace at once, as a cancel does not.
        """
        if not grace_s:
            _kill_group(self.proc.pid)
            return None
        _kill_group(self.proc.pid, "SIGTERM")
        _kill_group(self.proc.pid, "SIGCONT")  # a stopped process acts on SIGTERM only once continued (as systemd)
        self.watching = True  # no pidfd from here: its poll would spin once the shell has exited
        if self.pidfd is not None:
            self.poller.unregister(self.pidfd)
        deadline = time.monotonic() + grace_s
        while group_left(self.proc):
            hard = abort()
            hard = None if hard in SOFT_STOPS else hard  # a cancel during a timeout's grace changes nothing
            if hard or time.monotonic() >= deadline:
                _kill_group(self.proc.pid)
                return f"killed: {hard}" if hard else f"killed after {grace_s:g}s grace"
            if any(fd == self.fd for fd, _ in self.poller.poll(GRACE_STEP_S * 1000)):
                self._read()
            self._maybe_flush()
        return "terminated"

    def _drain(self) -> None:
        # The shell exited. Take what is buffered, but do not wait for EOF: a background child
        # (`cmd &`) may hold the pipe open for as long as it likes.
        drained = self.total
        while not self.eof and self.total - drained < 64 * OUTPUT_TAIL_BYTES and \
                any(fd == self.fd for fd, _ in self.poller.poll(0)):
            self._read()

    def _read(self) -> None:
        chunk = os.read(self.fd, 65536)
        self.eof = not chunk
        if self.eof:
            self.poller.unregister(self.fd)  # a closed pipe would wake poll() forever
        self.total += len(chunk)
        self.tail += chunk
        del self.tail[:-self.keep_bytes]  # from the front: bytearray makes that cheap, whatever the size

    def _maybe_flush(self) -> None:
        # Short jobs never get here often enough to flush: they pay nothing for --follow.
        now = time.monotonic()
        if self.on_output and self.total != self.flushed_total and now - self.flushed_at >= OUTPUT_FLUSH_S:
            self.flushed_at, self.flushed_total = now, self.total
            self.on_output(bytes(self.tail), self.total)


def _wait_a_little(proc) -> None:
    """The shell closed its output but has not exited: wait in short steps so aborts stay responsive."""
    import subprocess
    try:
        proc.wait(0.25)
    except subprocess.TimeoutExpired:
        pass


def _kill_group(pgid: int, signal_name: str = "SIGKILL") -> None:
    import signal
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or a setuid leader
        os.killpg(pgid, getattr(signal, signal_name))


def group_left(proc) -> bool:
    """True while a process of the run's group (the job's first process is its leader) has not
    exited. A member that exited counts as gone even if nobody reaps it (a zombie, as orphans here
    may stay). The leader is not reaped here but by end_run, which needs its PID kept from reuse."""
    if not hasattr(os, "waitid"):  # without it (and without /proc) only the leader can be watched
        return proc.poll() is None
    with contextlib.suppress(ChildProcessError):  # reaped elsewhere: gone
        if proc.returncode is None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return True  # the leader runs (WNOWAIT: asked without reaping it)
    return any(fields and fields[2] == str(proc.pid) and (fields[0] not in ("Z", "X") or len(_threads(pid)) >= 2)
               for pid in _pids() for fields in [_stat_fields(pid)])  # alive: proc_start_time's rule, one read


def _outcome(code: int, reason: str | None, output: bytes, duration: float, timeout_s: float,
             ended: str | None = None) -> Outcome:
    """Turn a return code and an interruption reason (and how the run then ended, see
    _Capture.stop) into an Outcome with a clear error."""
    import signal
    how = f" ({ended})" if ended else ""
    if reason == "timeout":
        return Outcome(None, f"{TIMED_OUT} after {timeout_s:g}s{how}", output, duration)
    if reason:
        return Outcome(None, reason + how, output, duration, interrupted=reason)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return Outcome(128 - code, f"killed by signal {name}", output, duration)
    if code == 0:
        return Outcome(0, None, output, duration)
    return Outcome(code, f"exit code {code}", output, duration)


# ==== Workers ====================================================================================

def run_token(job: Job, worker_id: str) -> str:
    """A string unique to one run of one job, placed in its environment to find orphans later."""
    return f"{worker_id}/{job.run_count}/{job.id}"


class Holdings:
    """The runs a worker's runners hold, from the answer of the claim that took the job until its
    result is written, and the claims the worker took back.

    A claim is one transaction; if the connection drops after the server committed it but before
    the runner read the answer, the job is `processing` under this live worker and no runner knows
    it. The sweeper takes such a run back (see Sweeper._take_back_strays) and requeues it. One lock
    orders "a runner takes the job its claim returned" against "the worker takes a run back": a run
    a runner holds is never taken back, and a run taken back is never run, however late its answer.
    """

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.held: set[tuple[str, int]] = set()  # (job id, run)
        self.taken_back: dict[tuple[str, int], float] = {}  # (job id, run) -> monotonic time taken back

    def take(self, job: Job) -> bool:
        """A claim answered `job`: True if the runner may run it, False if the worker took it back."""
        with self.lock:
            if (job.id, job.run_count) in self.taken_back:
                return False
            self.held.add((job.id, job.run_count))
            return True

    def release(self, job: Job) -> None:
        """The runner is done with this run (its result written, or given up by a hard stop)."""
        with self.lock:
            self.held.discard((job.id, job.run_count))

    def holds(self, key: tuple[str, int]) -> bool:
        """Whether a runner holds this run now."""
        with self.lock:
            return key in self.held

    def take_back(self, key: tuple[str, int], now_mono: float) -> bool:
        """Take a run no runner holds away from the runners; False if one holds it after all."""
        with self.lock:
            if key in self.held:
                return False
            # A late answer arrives within the connection's timeouts, far sooner than an hour.
            self.taken_back = {k: at for k, at in self.taken_back.items() if now_mono - at < 3600}
            self.taken_back[key] = now_mono
            return True


class Runner:
    """One runner thread of a worker process: claim a due job, run it, record what happened.
    (A Worker is the process `worker start` starts, with one registration and N runners.)"""

    def __init__(self, store: Store, worker_id: str, abort, queues: tuple = (), current_registration=lambda: 0,
                 keep_claiming=lambda: False, give_up=lambda: False, holdings: Holdings | None = None,
                 claim_may_log: Callable[[str], None] = lambda job_id: None, on_claim=lambda: None,
                 only: str | None = None):
        self.store = store
        self.only = only  # the one job it may claim (`run --burst`; see Store.claim), or None for any
        self.claim_may_log = claim_may_log  # see ScheduleFirer.claim_may_log
        self.on_claim = on_claim  # called when a claim of its own found a job, as it starts: there may be more
        self.worker_id = worker_id
        self.abort = abort  # abort(job, registration) -> reason to kill the running job, or None
        self.give_up = give_up  # a hard stop: stop trying to record a result
        self.queues = queues
        self.current_registration = current_registration  # the worker's registration number now
        self.keep_claiming = keep_claiming  # claim the next job in the same commit as a result?
        self.prefetched: tuple[Job, int] | None = None  # (job, registration) claimed with the last result
        self.execute = self._run_command  # injectable for tests and simulation
        self.current: Job | None = None
        self.running = False  # a job's process runs (from its start until it ended or was killed)
        self.settings, self.settings_at = {}, -math.inf
        self.holdings = holdings or Holdings()  # shared by the worker's runners and its sweeper
        self.flushing = None  # the thread of the output flush under way, where flushes have one (see _flush)

    def run_once(self, now: float | None = None) -> bool:
        """Claim and run at most one job; True if one was run."""
        job, registration = self.prefetched or (None, self.current_registration())
        self.prefetched = None
        fresh = not job  # a claim of its own, not one made with the last result
        if fresh:
            job = self._held(self.store.claim(self.worker_id, self.store.now() if now is None else now, self.queues,
                                              self.only))
            if job is None:
                return False
        self.current = job
        try:
            self._record(job, self._run(job, registration, fresh), now)
        finally:
            self.holdings.release(job)
            self.current = self.prefetched and self.prefetched[0]  # a prefetched job is already ours
        return True

    def _held(self, job: Job | None) -> Job | None:
        """The job a claim answered, unless its answer came so late that the worker took it back."""
        if job is None or self.holdings.take(job):
            return job
        log.warning("job %s: claim answered after the worker took it back; not run here", job.id,
                    extra=event("claim_taken_back", job_id=job.id, run=job.run_count))
        return None

    def _run(self, job: Job, registration: int, fresh: bool = False) -> Outcome:
        if not log.quiet:
            self.claim_may_log(job.id)
            log.routine("job %s claimed (attempt %d): %s", (job.id, job.attempts + 1, _short(job.command)),
                        lambda: event("job_claimed", job_id=job.id, attempt=job.attempts + 1, command=job.command))
        env = {"QUEUECTL_JOB_ID": job.id, "QUEUECTL_ATTEMPT": str(job.attempts + 1),
               "QUEUECTL_RUN": run_token(job, self.worker_id)}
        try:
            # Read first, and only then running: a read that hangs (a server that stopped answering) holds
            # no process, and the cut-off line counts only runs it kills (see Worker._note_cut_off).
            self._settings()
            if fresh:  # only now: the runner it wakes would claim on our connection before our start
                self.on_claim()
            self.running = True
            return self.execute(job, env, lambda: self.abort(job, registration),
                               lambda tail, total: self._flush(job, tail, total))
        except Exception as e:  # noqa: BLE001 - a claimed job must always get a recorded outcome
            log.exception("job %s: internal error while running", job.id,
                          extra=event("job_internal_error", job_id=job.id, error=repr(e)))
            return Outcome(None, f"internal error: {e!r}", b"", 0.0)
        finally:
            self.running = False
            if self.flushing:  # the result goes through the same connection: no two transactions at once
                self.flushing.join()

    def _run_command(self, job: Job, env: dict, abort, on_output) -> Outcome:
        # Jobs die with their worker where other hosts may rerun them; output-limit as last read. A
        # notification job (see migration 6) reads its dead job's output; only it pays for the read.
        stdin = self.store.dead_output(job) if "QUEUECTL_DEAD_RUN" in job.env else None
        if stdin is not None and not os.path.isdir(job.cwd):  # its dead job's folder is gone (maybe why it died):
            job = Job(**{**job.__dict__, "cwd": "/"})  # the notification must still tell
        return run_command(job, env, abort, on_output, die_with_worker=self.store.shared_by_hosts,
                           keep_bytes=self._settings()["output_limit"], kill_grace=self._kill_grace, stdin=stdin)

    def _flush(self, job: Job, tail: bytes, total: int) -> None:
        """Best effort: a busy database must not stall the job's output pipe. The loop that calls this
        also asks abort() every 250 ms, which must kill the job on time when the worker is cut off from
        the database (PostgreSQL): there a flush runs on a thread of its own, so a connection that hangs
        cannot hold that loop up, and a flush due while the last one is still under way is skipped."""
        if not self.store.cut_off_kills:
            return self._flush_now(job, tail, total)
        if self.flushing is None or not self.flushing.is_alive():
            import threading
            self.flushing = threading.Thread(target=self._flush_now, args=(job, tail, total), name="flush",
                                             daemon=True)
            try:
                self.flushing.start()
            except RuntimeError:  # no thread to be had (a process limit): skip this flush, not the job
                self.flushing = None  # never started, so never joined
                log.debug("job %s: output not flushed (no thread for it)", job.id,
                          extra=event("output_not_flushed", job_id=job.id))

    def _flush_now(self, job: Job, tail: bytes, total: int) -> None:
        try:
            self.store.flush_output(job, tail, total)
        except (QueueError, sqlite3.Error) as e:
            log.debug("job %s: output not flushed (%s)", job.id, e, extra=event("output_not_flushed", job_id=job.id))

    def _record(self, job: Job, outcome: Outcome, now: float | None) -> None:
        """Write the outcome, retrying until the database takes it: a finished run is never dropped,
        except by a hard stop, which leaves it to crash recovery (the job is still ours, processing)."""
        failing = None  # made at the first failure: nothing to build for a result written at once
        while True:
            try:
                return self._write_outcome(job, outcome, self.store.now() if now is None else now)
            except (QueueError, sqlite3.Error) as e:
                if self.give_up():
                    break
                failing = failing or Backoff(f"recording the result of job {job.id}", 0.5)
                time.sleep(failing.failed(e))
        log.warning("job %s: result not recorded (hard stop); crash recovery will run it again", job.id,
                    extra=event("result_not_recorded", job_id=job.id, attempt=job.attempts + 1))

    def _write_outcome(self, job: Job, outcome: Outcome, now: float) -> None:
        if outcome.interrupted:
            lost = outcome.interrupted == CUT_OFF  # as if the worker had died: counts toward the poison cap
            state = self.store.interrupt(job, self.worker_id, outcome, lost, now, outcome.stuck)
            log.info("job %s %s (%s)", job.id, f"-> {state}" if state else "no longer ours", outcome.error,
                     extra=event("job_interrupted", job_id=job.id, attempt=job.attempts + 1, state=state,
                                 error=outcome.error))
            return
        if not self.keep_claiming():
            return _log_result(job, self.store.finish(job, self.worker_id, outcome, self._settings(), now), outcome)
        registration = self.current_registration()
        after, following = self.store.finish_and_claim(job, self.worker_id, outcome, self._settings(), now,
                                                        self.queues)
        following = self._held(following)
        self.prefetched = following and (following, registration)
        _log_result(job, after, outcome)

    def _settings(self) -> dict:
        """Config, re-read at most once a second: not a query per job, yet a change applies quickly.
        When the database cannot answer, the settings last read stand (and it is asked again next
        time): a run being started or stopped must not fail on a config read. Only the first read,
        with nothing to fall back on, raises."""
        mono = time.monotonic()
        if mono - self.settings_at > 1.0:
            try:
                self.settings, self.settings_at = self.store.config_all(), mono
            except (QueueError, sqlite3.Error):
                if not self.settings:
                    raise
        return self.settings

    def _kill_grace(self) -> float:
        """kill-grace as read when the run started. Never read again here: this is asked on the way to
        killing a job (a timeout, a cancel), and a read from a database that hangs would hold the kill
        up, and with it the cut-off kill, past the time another host may rerun the job."""
        return self.settings.get("kill_grace", CONFIG["kill_grace"][0])


def _log_result(job: Job, after: Job | None, outcome: Outcome) -> None:
    if after is None:
        log.warning("job %s: result discarded, this worker no longer owns it", job.id,
                    extra=_run_event("result_discarded", job, outcome))
    elif after.state == COMPLETED:
        if not log.quiet:  # the hot path: a quiet worker builds nothing for it
            log.routine("job %s completed in %.2fs", (job.id, outcome.duration_s),
                        lambda: _run_event("job_completed", job, outcome))
    elif after.state == FAILED:
        retry_in_s = max(0.0, after.next_run_at - time.time())
        log.info("job %s failed (%s); retry %d in %.0fs", job.id, outcome.error, after.attempts + 1, retry_in_s,
                 extra=_run_event("job_failed", job, outcome, retry_in_s=round(retry_in_s, 3)))
    else:
        log.info("job %s dead after %d attempt%s: %s", job.id, after.attempts, "s" if after.attempts != 1 else "",
                 outcome.error, extra=_run_event("job_dead", job, outcome))


def _run_event(name: str, job: Job, outcome: Outcome, **more) -> dict:
    """A log event about a run that ended: the job, which attempt it was, and how it ended."""
    return event(name, job_id=job.id, attempt=job.attempts + 1, exit_code=outcome.exit_code, error=outcome.error,
                 duration_s=round(outcome.duration_s, 6), **more)


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _cell(text: str, width: int) -> str:
    """A table cell `width` terminal columns wide: truncated with … as _short does, then padded. Counts what a
    terminal draws: a wide (CJK, fullwidth) character takes two columns, a combining or zero-width one none."""
    text = " ".join(text.split())
    if text.isascii():
        return f"{_short(text, width):<{width}}"
    sizes = [_columns(c) for c in text]
    room = width if sum(sizes) <= width else width - 1  # one column for the …
    kept, used = 0, 0
    while kept < len(text) and used + sizes[kept] <= room:
        used += sizes[kept]
        kept += 1
    ellipsis = "…" if kept < len(text) else ""
    return text[:kept] + ellipsis + " " * (width - used - len(ellipsis))


def _columns(char: str) -> int:
    import unicodedata  # only for ids that are not ASCII
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


class Sweeper:
    """Finds workers that died and makes their jobs runnable again, killing their leftovers first."""

    def __init__(self, store: Store, me: dict, worker_id: str, stalled=lambda: 0.0,
                 holdings: Holdings | None = None):
        self.store = store
        self.me = me
        self.worker_id = worker_id
        self.stalled = stalled  # seconds our own heartbeat was late in all: not held against anyone's lease
        self.holdings = holdings  # what our runners hold; None: no runners, no stray runs to look for
        self.strays: dict[tuple[str, int], float] = {}  # our runs no runner held -> monotonic time first seen
        # (id, started_at) -> (beat, monotonic time it last changed, stalled() then, its lease then, the longest
        # stale-timeout read since: see is_dead)
        self.seen: dict[tuple, tuple[int, float, float, float, float]] = {}
        self.stale_before: float | None = None  # stale-timeout as our previous sweep read it
        # runs this worker adopted and has not requeued yet: (job id, run) -> (run token or "", leftovers)
        self.recovering: dict[tuple[str, int], tuple[str, Leftovers]] = {}

    def sweep(self, now: float, now_mono: float | None = None) -> int:
        """One pass; returns how many jobs were recovered."""
        stale_s = self.store.config_get("stale_timeout")
        # The lease of a beat seen moving now: the longer of this value and the last one. The worker may
        # have read the last one with that beat, just before a change: it kills by that one's half.
        lease_s, self.stale_before = max(stale_s, self.stale_before or stale_s), stale_s
        rows = self.store.workers()
        # Read the clock after the rows: a stall while reading them must not age what we saw.
        now_mono = time.monotonic() if now_mono is None else now_mono
        for row in rows:
            if row.id != self.worker_id and self.is_dead(row, now_mono, stale_s, lease_s):
                self._drop(row)
        current = {(row.id, row.started_at) for row in rows}
        self.seen = {key: value for key, value in self.seen.items() if key in current}  # forget the departed
        orphans, adopted, own = self.store.swept_jobs(self.worker_id)
        for job_id, run_no, owner in orphans:
            run_worker = self.store.adopt(job_id, run_no, owner, self.worker_id)
            if run_worker:  # else another sweeper took it first: it is theirs to finish
                self._begin(job_id, run_no, run_worker)
        for job_id, run_no, run_worker in adopted:  # one a failed write left behind
            if (job_id, run_no) not in self.recovering:
                self._begin(job_id, run_no, run_worker)
        if self.holdings:
            self._take_back_strays(own, now_mono)
        return self.finish(now)

    def _take_back_strays(self, own: list[tuple], now_mono: float) -> None:
        # Our own runs that no runner holds: claims whose answer was lost with the connection (see
        # Holdings). One seen so for STRAY_GRACE_S is recovered like a lost worker's run (its token
        # is looked for too, though it never started), so a claim being handed over is left alone.
        unheld = [key for key in own if key not in self.recovering and not self.holdings.holds(key)]
        self.strays = {key: self.strays.get(key, now_mono) for key in unheld}
        for (job_id, run_no), since in self.strays.items():
            if now_mono - since >= STRAY_GRACE_S and self.holdings.take_back((job_id, run_no), now_mono):
                log.warning("job %s: claimed by this worker, but no runner got the claim's answer; requeueing",
                            job_id, extra=event("claim_unanswered", job_id=job_id, run=run_no))
                self._begin(job_id, run_no, self.worker_id)

    def is_dead(self, row: WorkerRow, now_mono: float, stale_s: float, lease_s: float | None = None) -> bool:
        """Same namespace: its PID tells at once (once its watchdog is done, or else as its lease
        does); an earlier boot: dead. Otherwise: its heartbeat stopped moving for stale_s, or for
        `lease_s` if that was in force when we saw it last move (less the time our own heartbeat
        could not be written). A stale-timeout lowered while a worker cannot beat (a server that hangs
        for it alone) does not shorten its lease: it still kills its runs at half the value it read."""
        if same_namespace(row, self.me):
            if not process_gone(row.pid, row.proc_start):
                return False
            if not watchdog_at_work(row.id):  # (PostgreSQL) it has seen the worker's runs gone
                return True
            # A watchdog still at work is waited for as long as it can take (HARD_STOP_S for what it
            # killed), then the lease decides, as on another host: one that never ends (stopped) must
            # not hold the runs for ever.
            stale_s = max(stale_s, HARD_STOP_S + 1.0)
        if previous_boot(row, self.me) and not self.store.shared_by_hosts:
            return True  # a local file: a row with our hostname and another boot id is an earlier boot
        key = (row.id, row.started_at)  # one registration: a re-registered worker starts afresh
        stalled = self.stalled()
        lease_s = max(stale_s, lease_s or stale_s)
        beat, since, stalled_then, lease_then, read_since = self.seen.get(
            key, (None, now_mono, stalled, stale_s, stale_s))
        if beat != row.beat:
            # The worker may hold the value it read with its beat before this one (the read after this one
            # may hang): any value our sweeps read since the one before we saw that beat move. A worker beats
            # up to every 2 s and we sweep every second, so that can be more than one sweep back.
            self.seen[key] = (row.beat, now_mono, stalled, max(read_since, lease_s), lease_s)
            return False
        self.seen[key] = (beat, since, stalled_then, lease_then, max(read_since, stale_s))
        return lease_expired(since, now_mono, max(stale_s, lease_then), stalled - stalled_then)

    def _drop(self, row: WorkerRow) -> None:
        # Deregister and adopt its jobs in one transaction: a job it claims after re-registering
        # has a newer run number, which the adoption leaves alone. If we die right after, our
        # jobs, adopted ones included, are recovered by the next sweep of another worker.
        self.seen.pop((row.id, row.started_at), None)
        for job_id, run_no, run_worker in self.store.drop_worker(row.id, row.beat, row.started_at,
                                                                 self.worker_id) or ():
            self._begin(job_id, run_no, run_worker)

    def _begin(self, job_id: str, run_no: int, run_worker: str) -> None:
        # Kill the run's processes first, then requeue: the other order would let a new run overlap
        # the old. Looked for here whoever held the job last: the dropped worker may be on another
        # host, and still have adopted a run that a worker of this host started.
        self.recovering[(job_id, run_no)] = (f"{run_worker}/{run_no}/{job_id}", Leftovers())

    def finish(self, now: float) -> int:
        """Kill what is left of each adopted run, wait up to half a second for it to be gone, then
        requeue the runs whose processes are all gone; the others wait for a later sweep, so slow
        exits never hold up the heartbeat. A run with a process that cannot be killed goes dead."""
        for token, left in self.recovering.values():
            kill_run(token, left)
        deadline = time.monotonic() + 0.5
        while any(not (left.stuck or left.gone()) for _, left in self.recovering.values()) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        recovered = 0
        for key, (_, left) in list(self.recovering.items()):
            if left.stuck or left.gone():
                recovered += self._requeue(*key, left, now)
                del self.recovering[key]  # only once written: a failed write is tried again
        return recovered

    def _requeue(self, job_id: str, run_no: int, left: Leftovers, now: float) -> int:
        job = self.store.get(job_id)
        if job.run_count != run_no:
            return 0
        stray = self.holdings is not None and (job_id, run_no) in self.holdings.taken_back
        why = CLAIM_ANSWER_LOST if stray else "worker lost"
        lost = Outcome(None, why, None, None, interrupted=why)
        state = self.store.interrupt(job, self.worker_id, lost, True, now, left.stuck)
        if state:
            log.warning("job %s recovered from %s -> %s%s", job_id, "a lost claim answer" if stray else "lost worker",
                        state, f" ({left.stuck})" if left.stuck else "",
                        extra=event("job_recovered", job_id=job_id, run=run_no, state=state, error=left.stuck))
        return 1 if state else 0


class Backoff:
    """Consecutive failures of one loop (a full disk, a database held busy): the wait before the next
    try doubles up to `high` seconds, and the log says so at the first failure and then at most every
    30 s, instead of 20 lines a second for as long as the disk stays full."""

    def __init__(self, what: str, high: float):
        self.what, self.high, self.count, self.logged_at = what, high, 0, 0.0

    def failed(self, error: Exception) -> float:
        """Count a failure; returns how long to wait before trying again."""
        self.count += 1
        if self.count == 1 or time.monotonic() - self.logged_at >= 30.0:
            log.warning("%s failed: %s; retrying (%d failure(s) in a row)", self.what, error, self.count,
                        extra=event("retrying", what=self.what, error=str(error), failures=self.count))
            self.logged_at = time.monotonic()
        return min(self.high, 0.05 * 2 ** min(self.count, 10))

    def ok(self) -> None:
        """A try succeeded: say so if it had been failing, and start over."""
        if self.count:
            log.warning("%s works again after %d failure(s)", self.what, self.count,
                        extra=event("works_again", what=self.what, failures=self.count))
            self.count = 0


class ScheduleFirer:
    """A worker's part in schedules: called from its housekeeping loop, it fires the due ones.

    It asks for the earliest next slot (one indexed lookup) at least every `check_s`, and fires as
    soon as a slot it knows of is due; firing is idempotent, whoever else fires too."""

    def __init__(self, heard=lambda: False):
        import threading
        # Whether the worker hears the notifications a schedule's change sends (a PostgreSQL worker whose
        # listener is connected, see Worker._listen, which then calls look_soon()): it may look seldom.
        self.heard = heard
        self.checked_at = -math.inf  # monotonic time of the last lookup
        self.due_at = math.inf  # the earliest next slot that lookup found (Unix seconds)
        self.due_mono = math.inf  # the same on the monotonic clock (see next_tick)
        self.unfired: dict[str, str] = {}  # schedule id -> why this host cannot fire it, as last logged
        # The jobs a firing under way has made and not logged yet (see claim_may_log).
        self.unlogged: set[str] = set()
        self.logged = threading.Condition()

    @property
    def check_s(self) -> float:
        """The longest time between two lookups: SCHEDULE_CHECK_S, or NOTIFIED_POLL_INTERVAL_S while heard."""
        return NOTIFIED_POLL_INTERVAL_S if self.heard() else SCHEDULE_CHECK_S

    def tick(self, store: Store, mono: float, now: float | None = None, slack: float = 0.0) -> list[tuple]:
        """Fire what is due; returns the events of Store.fire_schedules (logged here). A lookup due
        within `slack` seconds is made now (one wake-up for the worker's round)."""
        now = store.now() if now is None else now
        if mono + slack - self.checked_at < self.check_s and now < self.due_at:
            self.due_mono = mono + (self.due_at - now)  # again: the clock may have been set back since
            return []
        self.checked_at, events = mono, []
        earliest = store.next_schedule_at()
        if earliest is not None and earliest <= now:
            events = self._fire(store, now)
            earliest = store.next_schedule_at()
        # One still due (another worker is firing it, or this host lacks its zone) hides the next slots of the
        # others: look again in a second, also where lookups are otherwise check_s apart.
        if earliest is None:
            self.due_at = math.inf
        else:
            self.due_at = earliest if earliest > now else now + SCHEDULE_CHECK_S
        self.due_mono = mono + (self.due_at - now)
        return events

    def next_tick(self) -> float:
        """The monotonic time at which tick() has something to do: the next lookup or the next slot."""
        return min(self.checked_at + self.check_s, self.due_mono)

    def look_soon(self) -> None:
        """A schedule changed: look at the next tick (the caller wakes the housekeeping loop)."""
        self.checked_at = -math.inf

    def _fire(self, store: Store, now: float) -> list[tuple]:
        """Fire what is due and log it; until then, a runner of this worker that claims a job just made
        waits to log its claim (see claim_may_log)."""
        try:
            events = store.fire_schedules(now, self._made)
            self._log(events)
            return events
        finally:
            with self.logged:
                self.unlogged.clear()
                self.logged.notify_all()

    def _made(self, job_id: str) -> None:
        with self.logged:
            self.unlogged.add(job_id)

    def claim_may_log(self, job_id: str) -> None:
        """Called by a runner before it logs a claim: if a firing of this worker made the job and has not
        logged it yet, wait for that line (at most FIRE_LOG_WAIT_S), so the log reads in order."""
        if job_id in self.unlogged:  # added before the commit that made the job claimable
            with self.logged:
                self.logged.wait_for(lambda: job_id not in self.unlogged, FIRE_LOG_WAIT_S)

    def _log(self, events: list[tuple]) -> None:
        """Log each event; a schedule this host cannot fire stays due and is tried again every second,
        so why is logged once (and again only if it changes), not 86,400 times a day."""
        for schedule_id, _, job_id, what in events:
            if what.startswith("not fired here"):
                if self.unfired.get(schedule_id) == what:
                    continue
                self.unfired[schedule_id] = what
            else:
                self.unfired.pop(schedule_id, None)
            log.info("schedule %s: %s", schedule_id, what,
                     extra=event("schedule_fired", schedule_id=schedule_id, job_id=job_id))


# ==== The worker process =========================================================================

def _ignore_signal(signum, frame) -> None:
    """The Python-level handler of a worker's stop signals: the wake-up byte does the work."""


M_ARENA_MAX = -8  # glibc's mallopt() parameter number (<malloc.h>)


def _few_malloc_arenas() -> None:
    """Cap glibc's malloc at two arenas, before the runner threads exist. By default glibc gives
    threads that allocate at once arenas of their own, up to eight per core; a worker's runners
    allocate little (they take turns under the GIL), but each arena keeps what was freed in it, and
    with --count 8 that held a large share of the worker's peak RSS (figures in DECISIONS.md). What
    MALLOC_ARENA_MAX in the environment says wins: glibc reads it at start, and the user chose it."""
    if "MALLOC_ARENA_MAX" in os.environ or not on_glibc():
        return
    try:
        import ctypes
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 2)
    except (ImportError, OSError, AttributeError):
        pass  # glibc's default: more memory, nothing else


def other_writers(path: str, st: os.stat_result, euid: int) -> str | None:
    """Why users other than the worker's may write the database file `path` (its `st`) and so choose
    the commands the worker runs as `euid`: the file owned by another user, or writable by its group
    or by everyone; None if neither. A warning, not a refusal: a group-shared queue is a feature."""
    import grp
    import pwd

    def name(lookup, number: int) -> str:
        try:
            return lookup(number)[0]
        except KeyError:  # no such user or group here (a file from elsewhere)
            return str(number)
    reasons = [f"owned by {name(pwd.getpwuid, st.st_uid)}"] if st.st_uid != euid else []
    if st.st_mode & 0o020:
        reasons.append(f"writable by group {name(grp.getgrgid, st.st_gid)}")
    if st.st_mode & 0o002:
        reasons.append("writable by every user")
    if not reasons:
        return None
    me = name(pwd.getpwuid, euid)
    return (f"worker runs as {me}, but the database {path} is {' and '.join(reasons)}: anyone who can "
            f"write it chooses the commands {me} runs")


class Worker:
    """One worker process: registers, runs N Runner threads, heartbeats, sweeps, polls, stops."""

    def __init__(self, target: str, count: int, burst: bool, queues: tuple = (), only: str | None = None):
        import threading
        self.target, self.count, self.burst, self.queues = target, count, burst, queues
        self.only = only  # `run --burst`: the one job this worker runs (it fires no schedule either)
        self.stopping = threading.Event()  # claim nothing more
        self.hard = threading.Event()  # kill running jobs and put them back
        self.hard_at = math.inf  # monotonic time of the hard stop
        self.stale_s = float(CONFIG["stale_timeout"][0])  # stale-timeout as last read (see cut_off)
        self.store = self._open()
        self.path = self.store.path  # the database's name for the log (no password)
        self.me = host_identity()
        self.worker_id = f"{self.me['host']}:{self.me['pid']}:{os.urandom(3).hex()}"
        self.wake, self.wakes = threading.Condition(), 0  # wakes: sent to idle runner threads so far (_wake_runners)
        self.signals = 0  # SIGINT and SIGTERM deliveries so far
        # The main loop's interruptible sleep, set by a burst worker's runner that found nothing to
        # claim and by a runner thread that ends: the drained queue or the last thread's exit is acted
        # on at once, not at the next poll (two polls' wait on every `worker start --burst`).
        self.tick = threading.Event()
        self.hearing = None  # SQLite: the socket this worker's wake-ups arrive on (see _start_hearing)
        self.listening = False  # PostgreSQL: the listener is connected and LISTENs (see _listen)
        self.registration = 0  # bumped at each re-registration; jobs claimed under an older one are killed
        self.stalled_s = 0.0  # how late our heartbeats were committed, in all (see lease_expired)
        self.beat_ok_at = time.monotonic()  # when the last heartbeat that went through was sent
        self.was_cut_off = False
        self.cut_runs: set[tuple[str, int]] = set()  # (job id, run) of runs a cut-off killed (see _note_cut_off)
        self.leaving: str | None = None  # why this worker may serve the database no more (see _leave)
        self.unregistered = False  # leaving with no row of ours left (see _on_lost_registration)
        self.runners: list[Runner] = []
        self.holdings = Holdings()  # the runs our runners hold, and claims taken back (see Holdings)
        self.canceled: set[tuple[str, int]] = set()  # (job id, run) of running jobs a user asked to cancel
        self.schedules = ScheduleFirer(heard=lambda: self.listening)
        self.runners_store: Store | None = None  # the connection runners share, where they may (see _runner_store)
        self.watchdog: Watchdog | None = None  # see run
        # The guard thread's (see _guard): its wake-up, the end of the run, and the lock whoever ends the
        # process takes first, the main thread or the guard at a hard stop's deadline.
        self.guard_wake, self.ended, self.exiting = threading.Event(), threading.Event(), threading.Lock()
        self.noting = threading.Lock()  # the guard and the main loop both note the cut-off
        self.owns_process = False  # exit the process itself when a hard stop outlasts HARD_STOP_S (see install_signals)
        self.sweeper: Sweeper | None = None  # see _run
        self.adopted_waits = False  # a hard stop waits for adopted runs' processes too (see _exit_by)

    def _open(self, **shared) -> Store:
        """A connection for one thread: busy waits are long, but end in time for a hard stop."""
        return open_database(self.target, durable=False, busy_deadline_s=30.0, give_up=self.give_up,
                             lease_s=self.stale_s, **shared)

    def _runner_store(self) -> Store:
        """A new runner's connection: its own on PostgreSQL, whose claims run side by side; on SQLite,
        where a process writes in turns anyway, one for all runners (see SqliteStore.shared)."""
        if not self.store.one_writer:
            return self._open()
        with self.wake:
            self.runners_store = self.runners_store or self._open(shared=True)
            return self.runners_store

    def give_up(self) -> bool:
        """True once a hard stop has left too little time to keep retrying the database: writes are
        retried for most of HARD_STOP_S (a result that can be written still is), then abandoned."""
        return time.monotonic() >= self.hard_at + HARD_STOP_S - 2.0

    # -- signals: counted by a thread of their own -----------------------------------------------

    def install_signals(self) -> None:
        """SIGINT/SIGTERM: first = graceful stop, second = hard stop; SIGQUIT = hard stop at once. SIGHUP
        (a closed terminal) = graceful stop, however many arrive; one ignored when we start (nohup) stays ignored.

        Python runs a handler once for several deliveries of a signal that land before it gets to
        run, and only in the main thread, which may be inside a long SQLite call. So the handlers
        do nothing, and a thread counts the bytes signal.set_wakeup_fd writes, one per delivery.
        (Two signals sent so close that the second arrives while the first is still pending are
        merged by the kernel: nothing can count those.)
        """
        import signal
        import threading
        self.owns_process = True  # the process is this worker's: a hard stop may end it (see _exit_late)
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)  # first: no delivery goes uncounted
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
            # `nohup queuectl worker start &` asks for a worker that outlives its terminal: keep its SIGHUP ignored.
            if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, _ignore_signal)
        threading.Thread(target=self._watch_signals, args=(read_fd,), name="signals", daemon=True).start()

    def _watch_signals(self, fd: int) -> None:
        import select
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            poller.poll()
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(fd, 512):
                    self.on_signal(signum)

    def on_signal(self, signum: int) -> None:
        """One delivered signal: the first SIGINT or SIGTERM stops gracefully; a second, or SIGQUIT, hard;
        SIGHUP always gracefully."""
        import signal
        if signum not in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
            return
        # A closed terminal sends SIGHUP twice, as a rule: its shell passes its own on to its jobs, and the
        # kernel sends one more to the foreground job when that shell exits. Counted, that would be a hard stop.
        if signum not in (signal.SIGQUIT, signal.SIGHUP):
            self.signals += 1
        if (signum == signal.SIGQUIT or self.signals >= 2) and not self.hard.is_set():
            self.hard_stop("SIGQUIT" if signum == signal.SIGQUIT else "second signal")
        self._stop("SIGHUP: its terminal closed?" if signum == signal.SIGHUP else "signal")

    def hard_stop(self, why: str) -> None:
        """Kill the running jobs and put them back (the caller stops the worker too)."""
        # In force before the line is written: a write to stderr may block (a full pipe, a terminal
        # paused with Ctrl+S), and the kills and the guard's deadline must not wait for it.
        self.hard_at = time.monotonic()
        self.hard.set()
        self.guard_wake.set()  # its deadline moved
        log.warning("%s: killing running jobs and putting them back", why, extra=event("hard_stop", reason=why))

    def abort_reason(self, job: Job, registration: int) -> str | None:
        """Why a running job must be killed now, if it must."""
        if self.hard.is_set():
            return "worker hard stop"
        if registration != self.registration:
            return "worker lost its registration"
        if self.cut_off():
            self.cut_runs.add((job.id, job.run_count))  # counted by the cut-off's line, even once it has ended
            return CUT_OFF
        return "canceled" if (job.id, job.run_count) in self.canceled else None

    # -- main loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; returns the exit code. Where jobs must die with the worker (PostgreSQL),
        a watchdog sees to it (see Watchdog), forked before our listener and runner threads exist."""
        self.watchdog = Watchdog.start(self.worker_id) if self.store.shared_by_hosts else None
        _few_malloc_arenas()
        clean = False
        try:
            code, clean = self._run(), True
            return code
        finally:
            self._stop_hearing()
            if self.watchdog:
                self.watchdog.stop(clean)  # not clean (an exception): it kills our runs, as if we had died
            self.ended.set()
            self.guard_wake.set()

    def _warn_other_writers(self) -> None:
        """Log who else can write an SQLite file (see other_writers). On PostgreSQL the schema and its
        tables were found owned by our role or one it is a member of when the store opened."""
        if is_postgres(self.target):
            return
        with contextlib.suppress(OSError):  # a file gone since it was opened: the next write says so
            note = other_writers(os.path.abspath(self.path), os.stat(self.path), os.geteuid())
            if note:
                log.warning("%s", note, extra=event("database_others_can_write", db=self.path))

    def _run(self) -> int:
        """Run until stopped; returns the exit code."""
        import threading
        threading.Thread(target=self._guard, name="guard", daemon=True).start()
        self._read_stale_timeout()
        self.beat_ok_at = time.monotonic()
        if not self.store.notifies:
            self._start_hearing()  # before the row that enqueues find us by
        self.store.register(self.worker_id, self.me, self.count, self.store.now(), self.queues)
        serves = f"queue{'s' if len(self.queues) > 1 else ''} {', '.join(self.queues)}" if self.queues else "all queues"
        log.info("worker started: %s, %d thread(s), %s, db %s", self.worker_id, self.count, serves, self.path,
                 extra=event("worker_started", worker_id=self.worker_id, threads=self.count, db=self.path,
                             queues=list(self.queues) or None))
        self._warn_other_writers()
        self.sweeper = Sweeper(self.store, self.me, self.worker_id, lambda: self.stalled_s, self.holdings)
        self._first_sweep()
        if self.store.notifies:
            self._start_listener()
        threads = [threading.Thread(target=self._thread_main, daemon=True) for _ in range(self.count)]
        for t in threads:
            t.start()
        self._loop(threads)
        for t in threads:  # after a hard stop, a thread still blocked in the database is left behind
            t.join(None if not self.hard.is_set() else max(0.0, self.hard_at + HARD_STOP_S - time.monotonic()))
        if self.runners_store and not any(t.is_alive() for t in threads):
            self.runners_store.close()
        self._finish_recoveries()
        self._deregister()
        code = EXIT_INTERRUPTED if self.hard.is_set() else EXIT_FAIL if self.leaving else EXIT_OK
        self.exiting.acquire()  # held by the guard if it is ending the process (see _exit_late): we never get it
        log.info("worker exited (%d)", code, extra=event("worker_exited", worker_id=self.worker_id, exit_code=code))
        return code

    def _first_sweep(self) -> None:
        """Recover what a previous crash or boot left, before claiming. A database that fails meanwhile
        (a dropped connection) is retried with backoff, as at every later sweep: it never ends the worker."""
        failing = Backoff("sweep at start", 1.0)
        while not self.stopping.is_set():
            try:
                self.sweeper.sweep(self.store.now())
                return failing.ok()
            except (QueueError, sqlite3.Error) as e:
                self.stopping.wait(failing.failed(e))

    def _finish_recoveries(self) -> None:
        """Before leaving, requeue the runs we adopted. Their killed processes are waited for even
        after a hard stop (at most HARD_STOP_S more): once we are gone the next sweeper adopts what is
        left, and its scan cannot see a killed process whose environment already reads empty."""
        deadline = min(time.monotonic(), self.hard_at + HARD_STOP_S) + HARD_STOP_S  # the guard's too (_exit_by)
        while self.sweeper.recovering and time.monotonic() < deadline:
            try:
                self.sweeper.finish(self.store.now())
            except (QueueError, sqlite3.Error) as e:
                log.warning("could not requeue adopted jobs (%s); the next worker will", e,
                            extra=event("requeue_failed", error=str(e)))
                break
        for _, left in self.sweeper.recovering.values():
            wait_gone(left, max(0.0, deadline - time.monotonic()))

    def _deregister(self) -> None:
        """Remove our row; if the database will not take it, the row of a process that is gone is
        cleaned up, and its unrecorded runs recovered, by the next sweep of any worker."""
        try:
            self.store.deregister(self.worker_id)
        except (QueueError, sqlite3.Error) as e:
            if not self.hard.is_set():
                raise
            log.warning("could not deregister (%s); other workers will recover what is left", e,
                        extra=event("deregister_failed", error=str(e)))

    def _loop(self, threads: list) -> None:
        # monotonic time of each task's next run; registering was our first heartbeat
        due = {"beat": time.monotonic(), "sweep": 0.0, "cancels": 0.0, "retention": 0.0, "poll": 0.0}
        failing, pause, last = Backoff("housekeeping", 1.0), 0.0, -math.inf
        while any(t.is_alive() for t in threads) and time.monotonic() < self.hard_at + HARD_STOP_S:
            woken = self.tick.wait(pause)
            if woken:  # woken early: at most one early round per TICK_GAP_S, never a spin
                self.tick.clear()
                time.sleep(max(0.0, last + TICK_GAP_S - time.monotonic()))
            last = time.monotonic()
            if not any(t.is_alive() for t in threads):
                break
            self._note_cut_off()  # so does the guard, on time even while this loop waits on the database
            try:
                self._housekeeping(due, time.monotonic(), woken)
                failing.ok()
                pause = self._pause(due)
            except Exception as e:  # noqa: BLE001 - no fault in heartbeat, sweep or poll may end the worker
                pause = failing.failed(e)

    def _housekeeping(self, due: dict, mono: float, woken: bool) -> None:
        """The tasks due (or due within ROUND_SLACK_S); the poll also when woken (see _poll)."""
        if self.watchdog:
            self.watchdog.check()
        soon = mono + ROUND_SLACK_S
        if soon >= due["beat"]:
            due["beat"] = self._beat(due["beat"])
        if soon >= due["sweep"]:
            due["sweep"] = mono + SWEEP_INTERVAL_S
            self.sweeper.sweep(self.store.now())
        if soon >= due["cancels"] and any(r.current for r in self.runners):
            due["cancels"] = mono + 0.5
            self.canceled = self.store.cancel_requests(self.worker_id)
        if soon >= due["retention"]:
            due["retention"] = mono + RETENTION_INTERVAL_S
            self._apply_retention()
        if not self.stopping.is_set() and not self.only:  # a stopping worker fires nothing more
            self.schedules.tick(self.store, mono, slack=ROUND_SLACK_S)
        if woken or soon >= due["poll"]:
            due["poll"] = self._poll(mono)

    def _pause(self, due: dict) -> float:
        """How long the main loop may sleep: until its next task, the next poll (a job falling due, or the
        regular check) or schedule slot, whichever comes first. A wake-up (self.tick) ends it sooner."""
        tasks = [due["beat"], due["sweep"], due["retention"], due["poll"]]
        if not self.stopping.is_set() and not self.only:
            tasks.append(self.schedules.next_tick())
        if any(r.current for r in self.runners):
            tasks.append(due["cancels"])
        return max(0.0, min(tasks) - time.monotonic())

    def _apply_retention(self) -> None:
        """Delete completed jobs older than `retention`, in slices so no write lock is held long."""
        keep_s = self.store.config_get("retention")
        if keep_s:  # at most 100,000 jobs a round: the heartbeat runs on this thread too
            self.store.purge_in_slices(COMPLETED, self.store.now() - keep_s, max_slices=100_000 // PURGE_SLICE)

    def _stop(self, why: str) -> None:
        if not self.stopping.is_set():
            running = sum(1 for r in self.runners if r.current)
            log.info("stopping (%s): claiming nothing more, waiting for %d running job(s)", why, running,
                     extra=event("worker_stopping", reason=why, running=running))
            self.stopping.set()
        self._wake_runners()

    def _wake_runners(self, every: bool = True) -> None:
        """Wake the idle runner threads: every one (we are stopping), or one, for a job that may be due.
        That one wakes the next once its claim found a job (Runner.on_claim), and so on: a wake-up costs
        one claim that finds nothing, not one for each idle thread."""
        with self.wake:
            self.wakes += 1
            if every:
                self.wake.notify_all()
            else:
                self.wake.notify()

    def _beat(self, due_mono: float) -> float:
        """Heartbeat that was due at `due_mono`; returns when the next one is due. The time it came
        late (the database held by a long write, or full) is added to stalled_s: other workers
        could not beat either, so the sweeper does not hold it against their leases."""
        interval = self._heartbeat()
        done = time.monotonic()
        self.stalled_s += max(0.0, done - due_mono)
        return done + interval

    def _heartbeat(self) -> float:
        """Beat, obey a stop request; returns seconds to the next beat."""
        sent = time.monotonic()
        stop = self.store.heartbeat(self.worker_id, self.store.now())
        if stop is None:
            self._on_lost_registration()
        elif stop:
            self._stop("worker stop")
        self.beat_ok_at = sent  # when it was sent: no sweeper can have seen it earlier
        if not self.leaving:
            why = self.store.moved_on()
            if why:
                self._leave(why)
        self._read_stale_timeout()
        return max(0.2, min(2.0, self.stale_s / 5))

    def _leave(self, why: str) -> None:
        """Stop for good, exit 1: the database moved on (see Store.moved_on). The running jobs finish and
        the heartbeat goes on meanwhile (a worker that stopped beating would see its jobs rerun by others)."""
        self.leaving = why
        log.error("%s; exiting 1 once the running jobs finish", why,
                  extra=event("database_moved_on", db=self.path, reason=why))
        self._stop("the database moved on")

    def _read_stale_timeout(self) -> None:
        """Read stale-timeout; a new value also bounds how long our connections may hang (the
        listener's keeps the value it was opened with: it only carries wake-ups, which the poll backs)."""
        self.stale_s = self.store.config_get("stale_timeout")
        # Told at every beat, changed or not (a store reopens only when its lease changed): a runner
        # whose connection was being opened with the old value when it changed joins self.runners after
        # the loop below has run, and would keep that value for good.
        for store in [self.store, *(runner.store for runner in self.runners)]:
            store.set_lease(self.stale_s)

    def cut_off(self) -> bool:
        """True when this worker has not got a heartbeat through for half of stale-timeout (on our
        monotonic clock) and must kill its running jobs. A sweeper on another host reruns them once
        our heartbeat has stood still for stale-timeout, so they die before a rerun can start: they
        are recorded as lost when the database is back (a write a rerun made stale is discarded).
        PostgreSQL only: an SQLite heartbeat fails only when the file fails everyone, and sweepers
        discount that time (stalled_s), so nobody reruns our jobs meanwhile."""
        return self.store.cut_off_kills and time.monotonic() - self.beat_ok_at > self.stale_s / 2

    def _note_cut_off(self) -> None:
        with self.noting:  # one line for each change, whichever thread sees it first
            cut = self.cut_off()
            if cut and not self.was_cut_off:
                # The jobs whose processes run now: the runners kill them within their next look at abort().
                late, running = time.monotonic() - self.beat_ok_at, len(self._cut_runs())
                log.error("no heartbeat for %.1fs (half of stale-timeout): killing %d running job(s), "
                          "to be recorded as lost when the database is back", late, running,
                          extra=event("heartbeat_lost", seconds=round(late, 3), running=running))
            elif self.was_cut_off and not cut:
                log.warning("heartbeat works again; claiming again", extra=event("heartbeat_back"))
                self.cut_runs.clear()
            self.was_cut_off = cut

    def _cut_runs(self) -> set[tuple[str, int]]:
        """The runs a cut-off kills: those running now, and those a runner saw cut off and killed before
        this thread got to say so (a runner checks every GRACE_STEP_S; the guard may be scheduled later)."""
        running = {(r.current.id, r.current.run_count) for r in list(self.runners) if r.running and r.current}
        return running | set(self.cut_runs)

    # -- the guard: what must happen on time whatever the database does ---------------------------

    def _guard(self) -> None:
        """A thread that makes no database call (the main loop may wait on a connection that hangs for as
        long as the server does): it logs the cut-off when it happens, and ends the process of a hard
        stop that outlasts HARD_STOP_S. Wakes at those moments, else once a second."""
        while not self.ended.is_set():
            now = time.monotonic()
            if now >= self._exit_by():
                return self._exit_late()
            self._note_cut_off()
            wake = min(now + 1.0, self._exit_by())
            if self.store.cut_off_kills and not self.was_cut_off:
                wake = min(wake, self.beat_ok_at + self.stale_s / 2 + 0.01)  # just past the moment cut_off() turns
            self.guard_wake.wait(max(0.0, wake - now))
            self.guard_wake.clear()

    def _exit_by(self) -> float:
        """When a hard-stopped worker is gone at the latest: HARD_STOP_S after the signal, HARD_STOP_S more
        if it has adopted runs whose killed processes it waits for (see _finish_recoveries)."""
        if not self.hard.is_set():
            return math.inf
        self.adopted_waits = self.adopted_waits or bool(self.sweeper and self.sweeper.recovering)  # once seen, for good
        return self.hard_at + HARD_STOP_S * (2 if self.adopted_waits else 1)

    def _exit_late(self) -> None:
        """A hard stop's deadline passed with the main thread still at work (a database call that does not
        return): exit 130 now, as the README promises. What is not written is crash recovery's, as after a
        SIGKILL, and the watchdog kills what is left of our runs when it sees us gone. Only a worker that
        owns its process (not one a test runs in a thread)."""
        if not self.owns_process:
            return
        # The main thread takes the lock to write its last line and return: it has a moment for that, not
        # for ever (that line's write may block on stderr too); then the exit is ours, without a line.
        if self.exiting.acquire(timeout=LATE_EXIT_LINE_S):
            import threading
            # Written by a thread of its own, waited for a moment only: a stderr that blocks (a full pipe,
            # a terminal paused with Ctrl+S) holds the log's lock, and must not hold the exit.
            writer = threading.Thread(target=self._say_late, daemon=True)
            with contextlib.suppress(RuntimeError):  # no thread to be had (a process limit): exit without them
                writer.start()
                writer.join(LATE_EXIT_LINE_S)
        os._exit(EXIT_INTERRUPTED)

    def _say_late(self) -> None:
        """The late exit's lines (see _exit_late)."""
        late_s = time.monotonic() - self.hard_at
        log.warning("hard stop: the database did not let the worker finish within %.0fs; exiting without "
                    "deregistering, other workers will recover what is left", late_s,
                    extra=event("hard_stop_late", seconds=round(late_s, 3)))
        log.info("worker exited (%d)", EXIT_INTERRUPTED,
                 extra=event("worker_exited", worker_id=self.worker_id, exit_code=EXIT_INTERRUPTED))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # nothing may stand between this and the exit
                stream.flush()

    def _on_lost_registration(self) -> None:
        # Another worker declared us dead (we were paused past the lease) and requeued our jobs.
        # A new registration number makes every run claimed under the old one abort within 250 ms (so it
        # cannot overlap its rerun), including one whose claim is still being returned.
        self.registration += 1  # before anything that may fail
        # A database that moved on meanwhile (our lease ran out in an upgrade that found us dead) would refuse
        # the registration at every beat, for ever: then we leave instead.
        why = self.leaving or self.store.moved_on()
        if not (why and self.unregistered):  # leaving unregistered, every later beat finds no row again: said once
            log.error("this worker was presumed dead by another; killing its running jobs and %s",
                      "leaving" if why else "re-registering",
                      extra=event("registration_lost", worker_id=self.worker_id))
        if why:
            self.unregistered = True
            if not self.leaving:
                self._leave(why)
            return
        self.store.register(self.worker_id, self.me, self.count, self.store.now(), self.queues)

    def _poll(self, mono: float) -> float:
        """Wake an idle thread when a job is due; in burst mode, stop when the queue is drained. Returns
        when to poll again: at the regular check, or when the next job falls due if that is sooner (no
        wake-up comes when a delay or a backoff ends), but no sooner than TICK_GAP_S: jobs falling due
        close together in a queue no claim takes (paused, full, not ours) must not make a busy loop."""
        now, running = self.store.now(), any(r.current for r in self.runners)
        due = self.store.due_now(now, self.queues)
        if due:
            self._wake_runners(every=False)
        elif self.burst and not self.stopping.is_set() and not running and self.store.burst_done(now, self.queues):
            self._stop("burst: queue drained")
        at, regular = self.store.next_due_at(now), self._regular_check_s(due, running)
        return min(mono + regular, math.inf if at is None else mono + max(TICK_GAP_S, at - now))

    def _regular_check_s(self, due: bool, running: bool) -> float:
        """POLL_INTERVAL_S, or NOTIFIED_POLL_INTERVAL_S for a worker at rest whose listener hears: nothing due,
        nothing running, not --burst. No NOTIFY comes when a job ends, so a busy worker (a runner may have lost
        its claim to another process and wait) and a burst worker (it waits for others' jobs to end, to exit)
        look every second, as without a listener."""
        at_rest = self.listening and not (due or running or self.burst)
        return NOTIFIED_POLL_INTERVAL_S if at_rest else POLL_INTERVAL_S

    # -- wake-ups on a socket (SQLite) -----------------------------------------------------------

    def _start_hearing(self) -> None:
        """Bind this worker's wake-up socket (see wake_address) and start the thread that hears it. A
        name taken (by whoever guessed it) or no socket: the regular check alone finds the jobs."""
        import socket
        import threading
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        except OSError as e:
            return self._no_wake_ups(e)
        try:
            sock.bind(wake_address(os.stat(self.path), self.worker_id))
        except OSError as e:
            sock.close()
            return self._no_wake_ups(e)
        sock.setblocking(False)
        self.hearing = sock
        threading.Thread(target=self._hear, args=(sock,), name="wake-ups", daemon=True).start()

    def _no_wake_ups(self, error: OSError) -> None:
        log.warning("no wake-ups (%s): due jobs are found by the regular check, every %gs", error, POLL_INTERVAL_S,
                    extra=event("no_wake_ups", error=str(error)))

    def _hear(self, sock) -> None:
        # Whatever arrives, from whoever sent it, only sets the main loop's tick: it looks for due
        # jobs (at most once per TICK_GAP_S, however many arrive) and wakes a runner if it finds one.
        import select
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while not any(flags & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, flags in poller.poll()):
            with contextlib.suppress(OSError):  # BlockingIOError once the queue is empty
                for _ in range(64):  # a flood is read in bounded gulps: one look for each
                    sock.recv(1)
            self.tick.set()
            # The main loop looks no sooner: what arrives meanwhile waits (a flood fills the queue, then
            # its senders are refused), instead of costing this process a read for each datagram.
            self.ended.wait(TICK_GAP_S)
        sock.close()

    def _stop_hearing(self) -> None:
        """Unbind from wake-ups: the hearing thread sees the shutdown, and closes the socket."""
        if self.hearing:
            import socket
            with contextlib.suppress(OSError):
                self.hearing.shutdown(socket.SHUT_RDWR)

    # -- wake-ups by NOTIFY (PostgreSQL) ---------------------------------------------------------

    def _start_listener(self) -> None:
        """One more connection, which LISTENs: a transaction that makes a job due notifies it, and an idle
        runner thread is woken at once instead of at the next poll. LISTEN runs before the runner threads
        start, so no job enqueued after their first claim waits for the regular check."""
        import threading
        failing, listener = Backoff("listening for wake-ups", 5.0), None
        try:
            listener = self._open()
            listener.wait_notified(0)
        except QueueError as e:  # a connection dropped now: the listener thread opens one again
            failing.failed(e)
            if listener:
                listener.close()
            listener = None
        threading.Thread(target=self._listen, args=(listener, failing), name="listener", daemon=True).start()

    def _listen(self, listener: Store | None, failing: Backoff) -> None:
        # A wake-up is only a hint: the poll still finds every due job, so a lost connection costs
        # latency, never a job. It is opened again with backoff, and LISTENs again.
        while not self.stopping.is_set():
            try:
                listener = listener or self._open()
                woken = listener.wait_notified(1.0)
                failing.ok()
            except QueueError as e:
                # Nothing heard for now: the poll and the schedule lookup run every second again, from now on, not
                # from the seldom check planned while it heard (what was notified since the drop is lost).
                if self.listening:
                    self.listening = False
                    self.schedules.look_soon()
                    self.tick.set()
                self.stopping.wait(failing.failed(e))
                continue
            self.listening = True
            if SCHEDULES_CHANGED in woken:
                self.schedules.look_soon()
                self.tick.set()
            if "" in woken:  # a runner claims at once (a notification comes from whoever can write the queue)
                self._wake_runners(every=False)
                self.tick.set()  # and the main loop looks: the job may be due later, its sleep shorter
        if listener:
            listener.close()

    # -- runner threads --------------------------------------------------------------------------

    def _thread_main(self) -> None:
        runner, failing = None, Backoff("claim", 5.0)
        # A job claimed together with the last result is ours: run it even if a stop came since. A hard stop
        # ends claiming as soon as it is in force, not once `stopping` is set after its line (which may block).
        while not self.claiming_ends() or (runner and runner.prefetched):
            seen = self.wakes  # read before the claim: a wake-up sent during it is not lost
            if self.cut_off() and not (runner and runner.prefetched):  # it would be killed at once
                self.stopping.wait(0.1)  # until a heartbeat goes through
                continue
            try:
                runner = runner or self._new_runner()
                ran = runner.run_once()
                failing.ok()
            except (QueueError, sqlite3.Error) as e:  # busy or disk full: wait (not woken by the poller)
                self.stopping.wait(failing.failed(e))
                continue
            if not ran:
                if self.burst:
                    self.tick.set()  # maybe drained: the main loop checks at once
                with self.wake:
                    self.wake.wait_for(lambda: self.wakes != seen, IDLE_WAIT_S)
        if runner and runner.store is not self.runners_store:
            runner.store.close()
        self.tick.set()

    def claiming_ends(self) -> bool:
        """Whether runners claim nothing more: a stop, or a hard stop (in force before its log lines)."""
        return self.stopping.is_set() or self.hard.is_set()

    def _new_runner(self) -> Runner:
        store = self._runner_store()
        runner = Runner(store, self.worker_id, self.abort_reason, self.queues, lambda: self.registration,
                        lambda: not self.claiming_ends() and not self.only, self.give_up, self.holdings,
                        self.schedules.claim_may_log, on_claim=lambda: self._wake_runners(every=False), only=self.only)
        self.runners.append(runner)
        return runner


# ==== Dashboard ==================================================================================
#
# `queuectl dashboard`: one self-contained page and the small JSON API it polls, served by
# http.server. Every request opens its own Store: a sqlite3 connection must not be shared by the
# server's threads, and a GET request's connection is query-only, so a GET never writes.
# http.server is imported only when serving (it would slow every other command's start-up).

# Every request but the page's own carries the token in this header, and only there: a cookie would
# go to every server on the machine (browsers do not separate cookies by port), a query string ends up
# in history and logs. Another origin cannot set the header without CORS, which we never grant.
TOKEN_HEADER = "X-Queuectl-Token"
MAX_PAGE_JOBS = 1000
CHART_MINUTES = 60
MAX_REQUEST_BODY = 64 * 1024
# A connection gets a thread of its own, so connections that send half a request and wait (slowloris)
# must not hold threads and descriptors for long: each must deliver its whole request, headers and
# body, within REQUEST_DEADLINE_S of being accepted, and at most MAX_CONNECTIONS are served at once.
# A browser on any working link sends a dashboard request in far less than the deadline. The cap
# leaves most of the usual 1,024 descriptors free for the database connections of the requests.
REQUEST_DEADLINE_S = 10.0
MAX_CONNECTIONS = 64
# Nor may they hold much memory: http.server alone reads up to 100 header lines of 64 KiB each, and the
# cap's worth of connections sending that held several hundred MB. So no more than this plus the largest
# body is read from a connection: what the request line and headers may take (a browser's, cookies
# included, stay far below it).
MAX_REQUEST_HEAD = 64 * 1024
ACCEPT_PAUSE_S = 0.1  # out of descriptors: how long the server waits before it tries accept() again
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# Status codes for the QueueError subclasses (they all share exit code 1, so the class decides).
HTTP_STATUS_OF = ((NotFound, 404), (Conflict, 409), (UsageError, 400), (Busy, 503))
COMMON_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"))
PAGE_CSP = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
            "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


# -- JSON shapes shared with the CLI's --json ---------------------------------------------------


def live_workers(store: Store) -> list[WorkerRow]:
    """Workers that look alive (see looks_alive)."""
    me, now, stale = host_identity(), store.now(), store.config_get("stale_timeout")
    return [w for w in store.workers() if looks_alive(w, me, now, stale)]


def run_dict(run: dict) -> dict:
    """One run as users see it in --json output."""
    ended = run["ended_at"]
    return {**run, "output": output_text(run["output"]), "output_kept_bytes": len(run["output"] or b""),
            "started_at": iso(run["started_at"]), "due_at": iso(run["due_at"]),
            "ended_at": iso(ended), "duration_s": None if ended is None else round(ended - run["started_at"], 6)}
def status_dict(store: Store, queue: str | None = None) -> dict:
    """`status --json`: jobs per state, live worker processes, paused queues (['*']: every queue but those
    of paused_except)."""
    paused, resumed = paused_names(store.paused())
    return {"jobs": store.counts(queue), "active_workers": len(live_workers(store)), "paused": paused,
            "paused_except": resumed}


def stats_dict(store: Store, since_s: float, now: float) -> dict:
    """`stats --json`: the runs that ended in the last `since_s` seconds."""
    raw = store.stats(now - since_s, now)
    runs = {k: raw["outcomes"].get(k, 0) for k in (COMPLETED, FAILED, DEAD)}
    return {
        "window_s": since_s,
        "runs": runs,
        "throughput_per_min": round(sum(runs.values()) / (since_s / 60), 3) if since_s else 0.0,
        "duration_s": dict(zip(("max", "p50", "p95"), raw["duration"])),
        "wait_s": dict(zip(("p50", "p95"), raw["wait"][1:])),
        "oldest_eligible_age_s": raw["oldest_eligible_age_s"],
    }


def worker_dicts(store: Store, now: float) -> list[dict]:
    """`worker list --json`: every registered worker, whether it looks alive, the jobs it runs, and its
    queuectl version (null for a row an older queuectl left, which recorded none)."""
    live, held = {w.id for w in live_workers(store)}, store.processing_by_worker()
    return [{"id": w.id, "host": w.host, "pid": w.pid, "started_at": iso(w.started_at),
             "heartbeat_at": iso(w.heartbeat_at), "heartbeat_age_s": round(max(0.0, now - w.heartbeat_at), 3),
             "threads": w.threads, "alive": w.id in live, "stopping": bool(w.stop_requested),
             "queues": json.loads(w.queues) if w.queues else None, "jobs": held.get(w.id, []),
             "version": w.version}
            for w in store.workers()]


def show_dict(store: Store, job_id: str, job: Job | None = None) -> dict:
    """`show --json`: the job (read here unless given), its dependencies, its latest run's output and every run."""
    job, runs = job or store.get(job_id), [run_dict(r) for r in store.runs(job_id)]
    return {**job.to_dict(), "depends_on": store.depends_on(job_id),
            "output": runs[-1]["output"] if runs else None, "runs": runs}


def logs_dict(store: Store, job_id: str, run_no: int | None) -> dict:
    """What `logs [--run N]` prints, as JSON with the run's number, total size and end (null while running)."""
    run = store.run_output(job_id, run_no)
    if run is None and run_no is not None:
        raise NotFound(f"job {job_id!r} has no run {run_no}")
    number, output, total, ended = run or (None, None, 0, None)
    return {"id": job_id, "run": number, "output": output_text(output), "output_bytes": total,
            "output_kept_bytes": len(output or b""), "ended_at": iso(ended)}


def truncated_note(run: dict) -> str | None:
    """'last 64 KiB of 14.2 MiB' when a run printed more than was kept (output-limit), else None."""
    kept, total = run["output_kept_bytes"], run["output_bytes"]
    return f"last {size_text(kept)} of {size_text(total)}" if total > kept else None


# -- throughput per minute (the chart) ----------------------------------------------------------

def chart_start(now: float, minutes: int) -> float:
    """Start of a chart of `minutes` whole minutes whose last bar is the current minute."""
    return (now // 60 - (minutes - 1)) * 60


def minute_buckets(rows: list[tuple], start: float, minutes: int) -> list[dict]:
    """Store.runs_per_minute rows as one {at, completed, failed, dead} per minute, empty minutes included."""
    buckets = [{"at": iso(start + 60 * i), COMPLETED: 0, FAILED: 0, DEAD: 0} for i in range(minutes)]
    for minute, outcome, count in rows:
        if 0 <= minute < minutes:  # a run that ended "in the future" (a clock step) is left out
            buckets[minute][outcome] = count
    return buckets


def throughput_dict(store: Store, minutes: int, now: float) -> dict:
    """Finished runs per minute over the last `minutes` minutes, oldest minute first."""
    start = chart_start(now, minutes)
    return {"minutes": minutes, "start": iso(start),
            "buckets": minute_buckets(store.runs_per_minute(start), start, minutes)}


# -- metrics (Prometheus text exposition format) --------------------------------------------------

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RUN_OUTCOMES = (COMPLETED, FAILED, DEAD, "lost", "stopped", "canceled")
METRICS_WINDOWS = (("1m", 60), ("1h", 3600))  # queuectl_runs_finished's window label -> seconds


def metrics_text(store: Store, now: float) -> str:
    """`queuectl metrics` and GET /metrics: the queue as Prometheus gauges, run durations as a summary."""
    rows, paused = store.queue_counts(), store.paused()
    queues, counts = sorted({queue for queue, _, _ in rows}), {(queue, state): n for queue, state, n in rows}
    oldest = store.oldest_eligible_by_queue(now)
    hour = store.stats(now - 3600, now)  # its outcomes are the 1h window's
    finished = {window: hour["outcomes"] if seconds == 3600 else store.outcomes(now - seconds)
                for window, seconds in METRICS_WINDOWS}
    p50, p95 = (None if v is None else round(v, 6) for v in hour["duration"][1:])
    count, micros = store.run_totals()
    families = (
        ("queuectl_jobs", "Jobs by queue and state (every state of each queue that has jobs).",
         [({"queue": q, "state": state}, counts.get((q, state), 0)) for q in queues for state in STATES]),
        ("queuectl_workers", "Worker processes that look alive.", [({}, len(live_workers(store)))]),
        ("queuectl_oldest_due_age_seconds", "Seconds the longest-waiting job that is due and may run has waited, "
         "by queue (0 when none waits; no sample for a paused queue).",
         [({"queue": q}, round(max(0.0, now - oldest[q]), 3) if q in oldest else 0)
          for q in queues if not is_paused(q, paused)]),
        ("queuectl_runs_finished", "Runs that ended within the window (1m or 1h), by outcome.",
         [({"outcome": o, "window": w}, finished[w].get(o, 0)) for w, _ in METRICS_WINDOWS for o in RUN_OUTCOMES]),
        ("queuectl_run_duration_seconds", "Durations of the runs that ended completed, failed or dead: quantiles "
         "over the last hour (NaN when none ended), _sum and _count over every such run since the queue began.",
         [({"quantile": "0.5"}, p50), ({"quantile": "0.95"}, p95), ("_sum", {}, micros / 1e6), ("_count", {}, count)],
         "summary"),
    )
    return "".join(_metric(*family) for family in families)


def _metric(name: str, help_text: str, samples: list[tuple], kind: str = "gauge") -> str:
    """One metric family: HELP and TYPE lines, then a line per sample, (labels, value) or a summary's
    (suffix, labels, value) for _sum and _count (None is written NaN)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for *suffix, labels, value in samples:
        label_text = ",".join(f'{k}="{prometheus_escape(str(v))}"' for k, v in labels.items())
        sample_name = name + "".join(suffix)
        lines.append(f"{sample_name}{{{label_text}}} {_number(value)}" if labels else f"{sample_name} {_number(value)}")
    return "\n".join(lines) + "\n"


def _number(value: float | int | None) -> str:
    return "NaN" if value is None else repr(value)


def prometheus_escape(value: str) -> str:
    """A label value as the exposition format writes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# -- requests: query parameters, paths, replies -------------------------------------------------

class Query:
    """A request's query parameters, each given at most once; readers check values (UsageError = 400)."""

    def __init__(self, text: str):
        from urllib.parse import parse_qsl
        try:
            pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=20, errors="strict")
        except ValueError as e:  # too many fields, or percent-escapes that are not UTF-8
            raise UsageError(f"bad query string: {e}") from None
        self.values: dict[str, str] = {}
        for name, value in pairs:
            if name in self.values:
                raise UsageError(f"parameter {name!r} given twice")
            self.values[name] = value

    def only(self, allowed: tuple) -> None:
        """UsageError for a parameter this endpoint does not take."""
        unknown = sorted(set(self.values) - set(allowed))
        if unknown:
            raise UsageError(f"unknown parameter {unknown[0]!r} (valid: {', '.join(allowed) or 'none'})")

    def string(self, name: str) -> str | None:
        """The value; None when absent or blank (`?state=` means no filter)."""
        return self.values.get(name) or None

    def integer(self, name: str, default: int | None, low: int, high: int) -> int | None:
        """A whole number from low to high (parse_number), or the default when absent."""
        value = self.string(name)
        return default if value is None else parse_number(value, f"parameter {name!r}", low, high, integer=True)

    def state(self) -> str | None:
        """`state`: one of STATES, or None for all."""
        state = self.string("state")
        if state is not None and state not in STATES:
            raise UsageError(f"unknown state {state!r} (valid: {', '.join(STATES)})")
        return state

    def queue(self) -> str | None:
        """`queue`: a valid queue name, or None for all."""
        queue = self.string("queue")
        return None if queue is None else valid_queue(queue, "parameter 'queue'")

    def duration(self, name: str, default: float) -> float:
        """A duration such as 30s, 15m, 12h, 7d or plain seconds."""
        value = self.string(name)
        return default if value is None else parse_duration(value, f"parameter {name!r}")


def route_of(path: str) -> tuple[str, str | None]:
    """'/api/jobs/a%2Fb/logs' -> ('/api/jobs/ID/logs', 'a/b'): a job id is one path segment, percent-decoded."""
    from urllib.parse import unquote
    parts = path.split("/")
    if len(parts) < 4 or parts[1:3] != ["api", "jobs"]:
        return path, None
    try:
        job_id = unquote(parts[3], errors="strict")
    except UnicodeDecodeError:
        raise UsageError("the job id in the path is not UTF-8") from None
    return "/".join(parts[:3] + ["ID"] + parts[4:]), job_id


def given_token(headers) -> str | None:
    """The token a request carries: the X-Queuectl-Token header, else `Authorization: Bearer TOKEN` (what
    Prometheus's `authorization` and older scrapers send). A page of another site can set neither
    without a CORS preflight, which is never granted, and a browser sends Authorization on its own only
    after a 401 challenge, which the dashboard never makes."""
    token = headers.get(TOKEN_HEADER)
    if token is None:
        scheme, _, credentials = (headers.get("Authorization") or "").partition(" ")
        token = credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None
    return token


def same_secret(given: str | None, secret: str) -> bool:
    """Constant-time comparison that also takes non-ASCII input (compare_digest refuses such str)."""
    import secrets
    return given is not None and secrets.compare_digest(given.encode("utf-8", "replace"), secret.encode())


def loopback_host(host: str | None) -> bool:
    """Whether a Host header names this machine; a loopback-bound server refuses other names, which
    defeats DNS rebinding (a foreign name that resolves to 127.0.0.1)."""
    import ipaddress
    if host is None:  # HTTP/1.0 clients may omit it; a browser never does
        return True
    name = host[:host.index("]") + 1] if host.startswith("[") and "]" in host else host.rpartition(":")[0] or host
    try:
        return name.lower() in LOOPBACK_NAMES or ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:  # a name, not an address: only "localhost" is known to be this machine
        return False


def loopback_bind(bind: str) -> bool:
    """Whether a server listening on `bind` is reachable from this machine only: every address the
    name stands for is a loopback address ('' and 0.0.0.0 mean every interface; an unknown name is not)."""
    import ipaddress
    import socket
    try:
        infos = socket.getaddrinfo(bind or None, None, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False
    return all(ipaddress.ip_address(info[4][0].partition("%")[0]).is_loopback for info in infos)


class Reply:
    """An HTTP response: status, body bytes, content type, extra headers."""

    def __init__(self, status: int, body: bytes, content_type: str, headers: list | None = None):
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers or []


def json_reply(value, status: int = 200, headers: list | None = None) -> Reply:
    """A JSON reply (UTF-8, not ASCII-escaped)."""
    body = json.dumps(value, ensure_ascii=False).encode("utf-8", "replace")
    return Reply(status, body, "application/json; charset=utf-8", headers)


def error_reply(error: Exception) -> Reply:
    """A QueueError as JSON with the status its class stands for."""
    status = next((code for cls, code in HTTP_STATUS_OF if isinstance(error, cls)), 500)
    return json_reply({"error": str(error)}, status)


# -- the API: (method, path) -> (handler(store, query, job_id), parameters) ---------------------

def _api_status(store: Store, q: Query, _: None) -> dict:
    return status_dict(store, q.queue())


def _api_stats(store: Store, q: Query, _: None) -> dict:
    return stats_dict(store, q.duration("since", 3600), store.now())


def _api_throughput(store: Store, q: Query, _: None) -> dict:
    return throughput_dict(store, q.integer("minutes", CHART_MINUTES, 1, 1440), store.now())


def _api_metrics(store: Store, q: Query, _: None) -> Reply:
    return Reply(200, metrics_text(store, store.now()).encode(), METRICS_CONTENT_TYPE)


def _api_workers(store: Store, q: Query, _: None) -> list[dict]:
    return worker_dicts(store, store.now())


def _api_schedules(store: Store, q: Query, _: None) -> list[dict]:
    return [schedule.to_dict() for schedule in store.schedules()]


def _api_queues(store: Store, q: Query, _: None) -> list[dict]:
    return store.queues()


def _api_job(store: Store, q: Query, job_id: str) -> dict:
    return show_dict(store, job_id)


def _api_logs(store: Store, q: Query, job_id: str) -> dict:
    return logs_dict(store, job_id, q.integer("run", None, 1, 2**62))


def _api_jobs(store: Store, q: Query, _: None) -> Reply:
    """A page of jobs, newest first (each as in `list --json`); X-Total-Count is the filter's total."""
    state, queue = q.state(), q.queue()
    limit, offset = q.integer("limit", 50, 1, MAX_PAGE_JOBS), q.integer("offset", 0, 0, 2**62)
    jobs = store.page_jobs(state, queue, limit, offset)
    counts = store.counts(queue)
    total = counts[state] if state else sum(counts.values())
    return json_reply([j.to_dict() for j in jobs], headers=[("X-Total-Count", str(total))])


def _api_retry(store: Store, _: Query, job_id: str) -> dict:
    store.retry_dead([job_id], store.now())
    return store.get(job_id).to_dict()


def _api_retry_all(store: Store, q: Query, _: None) -> dict:
    """The page's "Retry all dead" (of its queue filter): `dlq retry --all [--queue Q]`."""
    return {"ids": store.retry_all_dead(q.queue(), store.now())}


def _api_cancel(store: Store, _: Query, job_id: str) -> dict:
    store.cancel([job_id], store.now())
    return store.get(job_id).to_dict()


def _api_delete(store: Store, _: Query, job_id: str) -> dict:
    store.delete([job_id])
    return {"id": job_id, "deleted": True}


API_ROUTES = {
    ("GET", "/api/status"): (_api_status, ("queue",)),
    ("GET", "/api/stats"): (_api_stats, ("since",)),
    ("GET", "/api/throughput"): (_api_throughput, ("minutes",)),
    ("GET", "/api/jobs"): (_api_jobs, ("state", "queue", "limit", "offset")),
    ("GET", "/api/jobs/ID"): (_api_job, ()),
    ("GET", "/api/jobs/ID/logs"): (_api_logs, ("run",)),
    ("GET", "/api/workers"): (_api_workers, ()),
    ("GET", "/metrics"): (_api_metrics, ()),
    ("GET", "/api/schedules"): (_api_schedules, ()),
    ("GET", "/api/queues"): (_api_queues, ()),
    ("POST", "/api/jobs/ID/retry"): (_api_retry, ()),
    ("POST", "/api/jobs/ID/cancel"): (_api_cancel, ()),
    ("POST", "/api/jobs/ID/delete"): (_api_delete, ()),
    ("POST", "/api/dlq/retry"): (_api_retry_all, ("queue",)),
}


# -- the server -----------------------------------------------------------------------------------

class Dashboard:
    """The dashboard's access rules and routes; serve() puts them behind a threaded HTTP server."""

    def __init__(self, target: str, *, token: str | None, allow_actions: bool = False):
        self.target, self.token, self.allow_actions = target, token, allow_actions
        self.path = database_name(target)  # for messages: no password
        self.loopback = True  # set by serve(): a loopback server answers only to loopback host names

    def serve(self, bind: str, port: int):
        """Listen on bind:port and return the server; serve_forever() runs it, shutdown() stops it."""
        import http.server
        import ipaddress
        import socket
        server_class = type("DashboardServer", (DashboardServer, http.server.ThreadingHTTPServer),
                            {"address_family": socket.AF_INET6 if ":" in bind else socket.AF_INET})
        handler = type("Handler", (DashboardHandler, http.server.BaseHTTPRequestHandler), {"dashboard": self})
        try:
            server = server_class((bind, port), handler)
        except OSError as e:  # address in use, unknown host name, no permission
            raise QueueError(f"cannot listen on {bind} port {port}: {e.strerror or e}") from None
        host, self.port = server.server_address[:2]
        self.loopback = ipaddress.ip_address(host).is_loopback
        return server

    def url(self, server) -> str:
        """The address to open, with the token in the fragment (which a browser never sends to any server)."""
        import ipaddress
        import socket
        host = server.server_address[0]
        if ipaddress.ip_address(host).is_unspecified:
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/" + (f"#token={self.token}" if self.token else "")

    def respond(self, method: str, target: str, headers) -> Reply:
        """Answer one request (headers: a mapping with .get); never raises, so no request can stop the server."""
        try:
            return self._respond(method, target, headers)
        except QueueError as e:
            return error_reply(e)
        except sqlite3.Error as e:
            return json_reply({"error": str(database_error(self.path, e, opening=False, write=method == "POST"))}, 500)
        except Exception:  # a bug: report it, keep serving
            log.exception("dashboard: %s %s failed", method, target, extra=event("dashboard_error"))
            return json_reply({"error": "internal error (see the dashboard's stderr)"}, 500)

    def _respond(self, method: str, target: str, headers) -> Reply:
        path, _, query_text = target.partition("?")
        query = Query(query_text)
        denied = self._denied(method, path, query, headers)
        if denied:
            return json_reply({"error": denied}, 403)
        return self._route(method, path, query)

    def _denied(self, method: str, path: str, query: Query, headers) -> str | None:
        """Why this request is refused (403), or None."""
        if self.loopback and not loopback_host(headers.get("Host")):
            return "this dashboard answers only to localhost, 127.0.0.1 or [::1] (Host header)"
        if "token" in query.values:
            return (f"the token goes in the {TOKEN_HEADER} header, not the query string "
                    "(in a browser, open the URL that `queuectl dashboard` printed)")
        if (method, path) == ("GET", "/"):  # the page holds no data: its script asks for it with the token
            return None
        if self.token and not same_secret(given_token(headers), self.token):
            return f"missing or wrong token: open the URL that `queuectl dashboard` printed (or send {TOKEN_HEADER})"
        return self._action_denied(headers) if method == "POST" else None

    def _action_denied(self, headers) -> str | None:
        # Even with --no-token an action needs the header: a browser lets another site post a form
        # here, but not set a custom header (that needs CORS, never granted).
        if not self.allow_actions:
            return "actions are off: start the dashboard with --allow-actions"
        if given_token(headers) is None:
            return f"actions need the {TOKEN_HEADER} header"
        origin = headers.get("Origin")
        if origin and origin != f"http://{headers.get('Host')}":
            return "cross-origin request refused"
        return None

    def _route(self, method: str, path: str, query: Query) -> Reply:
        pattern, job_id = route_of(path)
        if (method, pattern) not in API_ROUTES:
            return self._page(query) if (method, path) == ("GET", "/") else self._no_route(method, pattern)
        handler, params = API_ROUTES[method, pattern]
        query.only(params)
        if job_id is not None:
            _valid_id(job_id, "job id")
        with self._store(read_only=method == "GET") as store:
            result = handler(store, query, job_id)
        return result if isinstance(result, Reply) else json_reply(result)

    @staticmethod
    def _no_route(method: str, pattern: str) -> Reply:
        """404 for an unknown path; 405, with Allow, for a known one asked with the wrong method."""
        allowed = ["GET"] if pattern == "/" else [m for m, p in API_ROUTES if p == pattern]
        if not allowed:
            return json_reply({"error": f"no such endpoint: {pattern.replace('/ID', '/<id>')}"}, 404)
        return json_reply({"error": f"{method} is not allowed here (use {', '.join(allowed)})"}, 405,
                          [("Allow", ", ".join(allowed))])

    @contextlib.contextmanager
    def _store(self, read_only: bool):
        """A Store for this request alone; query-only for reads."""
        if not read_only and not is_postgres(self.target) and not os.path.exists(self.target):
            raise BadDatabase(f"database {self.path} no longer exists")  # an action must not make a new file
        try:
            store = open_database(self.target, reads_only=read_only)
        except NoQueue:  # not yet, or no longer: the page shows an empty queue until there is one
            store = EmptyStore(self.target)
        try:
            yield store
        finally:
            store.close()

    def _page(self, query: Query) -> Reply:
        query.only(())
        import secrets
        nonce = secrets.token_urlsafe(16)  # lets the page's own script and style run, and nothing else
        page = (DASHBOARD_PAGE.replace("{{NONCE}}", nonce).replace("{{NEEDS_TOKEN}}", "1" if self.token else "")
                .replace("{{ACTIONS}}", "1" if self.allow_actions else ""))
        return Reply(200, page.encode(), "text/html; charset=utf-8", [
            ("Content-Security-Policy", PAGE_CSP.format(nonce=nonce)), ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer")])


class Slot:
    """An accepted connection's place among the MAX_CONNECTIONS served: its deadline and its phase, "request"
    (arriving), "answer" (being worked out) or "reply" (being sent); a newer connection may take its place
    in the first and the last, when it waits on its client."""

    def __init__(self, deadline: float):
        self.deadline, self.phase, self.evicted = deadline, "request", False


class DashboardServer:
    """Mixed into http.server.ThreadingHTTPServer by Dashboard.serve()."""
    daemon_threads = True  # Ctrl+C does not wait for a browser's open connections
    allow_reuse_address = True
    # The kernel's queue of connections not yet accepted: nginx's and Apache's default (socketserver's
    # is 5). It costs no descriptor, and a handshake that finds it full is dropped, which costs its
    # client a second's retry: a burst of connections, a flood included, must not delay a page load.
    request_queue_size = 511

    def __init__(self, *args, **kwargs):
        import threading
        self.slots: dict = {}  # connection -> its Slot, oldest first; evicted ones until their thread ends
        self.slots_lock = threading.Lock()  # the accept loop and every connection's thread change slots
        self.out_of_files = False
        super().__init__(*args, **kwargs)

    def get_request(self):
        """accept(); out of descriptors, pause before the next try instead of spinning."""
        import errno
        try:
            request = super().get_request()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                self._pause_accepting()
            raise  # serve_forever drops it and polls again
        self.out_of_files = False
        return request

    def _pause_accepting(self) -> None:
        # The connection accept() could not take stays in the backlog, so the listening socket stays
        # readable: without a pause serve_forever would call accept() again at once, and spin. Requests
        # in progress close their connections and database files meanwhile.
        if not self.out_of_files:
            log.warning("dashboard: out of file descriptors; new connections wait until some close",
                        extra=event("dashboard_out_of_files"))
        self.out_of_files = True
        time.sleep(ACCEPT_PAUSE_S)

    def process_request(self, request, client_address) -> None:
        """Serve the connection in a thread of its own if it gets a slot; close it at once if not."""
        with self.slots_lock:
            admitted = self._free_slot()
            if admitted:
                self.slots[request] = Slot(time.monotonic() + REQUEST_DEADLINE_S)
        if not admitted:
            return self.shutdown_request(request)
        super().process_request(request, client_address)

    def _free_slot(self) -> bool:
        """Whether a new connection may be served: below the cap, or after evicting the oldest connection
        still sending its request or, if none is, still taking its reply (caller holds slots_lock)."""
        served = [(connection, slot) for connection, slot in self.slots.items() if not slot.evicted]
        if len(served) < MAX_CONNECTIONS:
            return True
        # Evicting the oldest connection that waits on its client, rather than refusing the newcomer, is
        # what keeps connections that never finish their request, or never read their reply, from shutting
        # everyone else out until their deadline: a real request, sent in one go, is in long before the
        # cap's worth of newer ones. A reply goes only when no request is arriving: most are out in one
        # write, and a flood of connections that send nothing must not starve the replies of real requests.
        oldest = next(((connection, slot) for phase in ("request", "reply") for connection, slot in served
                       if slot.phase == phase), None)
        if oldest is None:  # every slot is working on an answer: those end on their own
            return False
        import socket
        oldest[1].evicted = True  # before shutdown(): its thread must see an eviction, not the client's EOF
        with contextlib.suppress(OSError):
            oldest[0].shutdown(socket.SHUT_RDWR)  # wakes its thread's recv() or send(); that thread closes it
        return True

    def answering(self, slot: Slot) -> bool:
        """Mark the connection's request as read (not evictable while its answer is made); False if it was
        evicted already."""
        with self.slots_lock:
            slot.phase = "answer"
            return not slot.evicted

    def replying(self, slot: Slot) -> None:
        """Mark the connection as waiting on its client again, which now takes the reply (see _free_slot)."""
        with self.slots_lock:
            slot.phase = "reply"

    def shutdown_request(self, request) -> None:
        with self.slots_lock:
            self.slots.pop(request, None)
        super().shutdown_request(request)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also calls socket.getfqdn(), a reverse DNS lookup that can hang
        # for seconds on a machine without DNS; nothing here needs the name.
        import socketserver
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address) -> None:
        log.exception("dashboard: request from %s failed", client_address[0], extra=event("dashboard_error"))


class RequestReader(io.RawIOBase):
    """A connection's incoming bytes, cut off (TimeoutError) at its slot's deadline, when it is evicted, or
    past MAX_REQUEST_HEAD + MAX_REQUEST_BODY bytes."""

    def __init__(self, connection, slot: Slot):
        super().__init__()
        self.connection, self.slot = connection, slot
        self.unread = MAX_REQUEST_HEAD + MAX_REQUEST_BODY  # what a request may still send

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.slot.deadline - time.monotonic()
        if left <= 0 or self.slot.evicted:
            raise TimeoutError("the request did not arrive in time")
        if self.unread <= 0:
            # A TimeoutError too: http.server closes the connection without a reply at one, wherever in
            # the request it is raised (request line, headers or body).
            raise TimeoutError("the request is larger than any the dashboard takes")
        # The timeout is what is left of the whole request's time, not a fresh one per read: a client
        # sending a byte now and then must not keep its connection past the deadline.
        self.connection.settimeout(left)
        read = self.connection.recv_into(memoryview(buffer)[:self.unread])
        self.unread -= read
        if not read and self.slot.evicted:  # the end our shutdown() made: not a complete request
            raise TimeoutError("the connection was evicted before its request arrived")
        return read


class DashboardHandler:
    """The HTTP side, mixed into http.server.BaseHTTPRequestHandler by Dashboard.serve()."""
    dashboard: Dashboard
    server_version = f"queuectl/{__version__}"

    def setup(self) -> None:
        """StreamRequestHandler's files, the request read against the connection's deadline.
        (http.server closes the connection without a reply when that read raises TimeoutError.)"""
        super().setup()
        with self.server.slots_lock:
            self.slot = self.server.slots[self.request]
        self.rfile = io.BufferedReader(RequestReader(self.connection, self.slot))

    def version_string(self) -> str:
        """The Server header: queuectl's version only."""
        return self.server_version

    def do_GET(self) -> None:
        if self._request_read():
            self._send(self.dashboard.respond("GET", self.path, self.headers))

    def do_POST(self) -> None:
        try:  # "²" passes str.isdigit() but not int()
            length = parse_number(self.headers.get("Content-Length") or "0", "", 0, math.inf, integer=True)
        except UsageError:
            return self.send_error(400, "request body unreadable")
        if length > MAX_REQUEST_BODY:
            return self.send_error(413, "request body too large")
        # The body is ignored (the path says it all), but it is read: unread bytes would reset the socket.
        if len(self.rfile.read(length)) < length:  # the client stopped sending: no complete request to act on
            self.close_connection = True
            return
        if self._request_read():
            self._send(self.dashboard.respond("POST", self.path, self.headers))

    def _request_read(self) -> bool:
        """The request is in: keep the connection from eviction, and give the reply's writes a timeout."""
        self.connection.settimeout(REQUEST_DEADLINE_S)  # a client that does not read the reply cannot hold the thread
        return self.server.answering(self.slot)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a bad request line, an unknown method) as JSON too."""
        self.close_connection = True
        self._send(json_reply({"error": message or f"HTTP {code}"}, code))

    def _send(self, reply: Reply) -> None:
        # A client that reads slowly, or not at all, holds its slot for as long as the reply's writes may
        # take: so while they run, the slot may make way for a newcomer (after those still receiving requests).
        self.server.replying(self.slot)
        with contextlib.suppress(ConnectionError):  # the client left, or its slot made way; no one to tell
            self.send_response(reply.status)
            for name, value in (*reply.headers, *COMMON_HEADERS):
                self.send_header(name, value)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

    def log_message(self, format: str, *args) -> None:
        """No access log: the page polls several URLs every second or two."""


# -- the page: one HTML string with inline CSS and JS, no external resources ---------------------
# Every value from the database reaches the DOM as textContent (text nodes or SVG <title> text),
# never as HTML: no innerHTML anywhere, and no database value in an attribute.

DASHBOARD_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="queuectl-needs-token" content="{{NEEDS_TOKEN}}">
<meta name="queuectl-actions" content="{{ACTIONS}}">
<title>queuectl dashboard</title>
<link rel="icon" href="data:,">
<style nonce="{{NONCE}}">
:root { --bg: #f4f5f8; --card: #fff; --fg: #1c2230; --muted: #6b7385; --line: #e2e5eb; --hover: #eef1fb;
  --pending: #5468d4; --processing: #1b94c9; --completed: #2c9a58; --failed: #d9951a; --dead: #d23f3f;
  --workers: #7650c2; --code: #10131a; --codefg: #d7dde8; }
@media (prefers-color-scheme: dark) { :root { --bg: #12151b; --card: #1b1f27; --fg: #e4e7ec; --muted: #98a0af;
  --line: #2a303a; --hover: #242a36; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  background: var(--bg); color: var(--fg); }
header { display: flex; align-items: center; gap: 14px; padding: 10px 20px; background: var(--card);
  border-bottom: 1px solid var(--line); }
h1 { font-size: 18px; margin: 0; letter-spacing: .02em; }
h2 { font-size: 13px; margin: 0 0 10px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
h3 { font-size: 13px; margin: 14px 0 6px; color: var(--muted); }
#paused { color: var(--failed); font-weight: 600; }
#live { margin-left: auto; color: var(--muted); font-size: 12px; }
#live::before { content: ""; display: inline-block; width: 8px; height: 8px; border-radius: 50%;
  background: var(--completed); margin-right: 6px; }
#live.down::before { background: var(--dead); }
#banner { margin: 12px 20px 0; padding: 8px 12px; border-radius: 6px; background: #fde8e8; color: #8a1f1f;
  border: 1px solid #f3b4b4; }
main { padding: 16px 20px 24px; display: grid; gap: 16px; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; min-width: 0; }
.wide { grid-column: 1 / -1; }
@media (max-width: 900px) { main { grid-template-columns: minmax(0, 1fr); } }
#counts { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 12px; padding: 0;
  background: none; border: 0; }
.count { background: var(--card); border: 1px solid var(--line); border-top: 4px solid var(--c);
  border-radius: 8px; padding: 10px 14px; }
.count .n { font-size: 34px; font-weight: 650; line-height: 1.1; color: var(--c); font-variant-numeric: tabular-nums; }
.count .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .06em; }
.pending { --c: var(--pending); } .processing { --c: var(--processing); } .completed { --c: var(--completed); }
.failed { --c: var(--failed); } .dead { --c: var(--dead); } .workers { --c: var(--workers); }
#throughput { display: flex; gap: 20px; align-items: stretch; }
#chart { flex: 1; min-width: 0; height: 180px; }
#chart .grid { stroke: var(--line); } #chart text { fill: var(--muted); font-size: 11px; }
#chart rect.completed { fill: var(--completed); } #chart rect.failed { fill: var(--failed); }
#chart rect.dead { fill: var(--dead); } #chart g:hover rect { opacity: .75; }
#stats { width: 290px; flex: none; font-size: 13px; white-space: nowrap; border-left: 1px solid var(--line);
  padding-left: 16px; }
#stats div { display: flex; justify-content: space-between; gap: 12px; padding: 2px 0; }
#stats b { font-weight: 600; font-variant-numeric: tabular-nums; }
.legend { display: flex; gap: 12px; font-size: 12px; color: var(--muted); margin-bottom: 6px; }
.legend span::before { content: ""; display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; background: var(--c); vertical-align: -1px; }
.filters { display: flex; gap: 8px; align-items: center; margin-bottom: 8px; flex-wrap: wrap; }
select, input, button { font: inherit; font-size: 13px; color: var(--fg); background: var(--card);
  border: 1px solid var(--line); border-radius: 5px; padding: 4px 8px; }
input.invalid { border-color: var(--dead); }
button { cursor: pointer; } button:disabled { opacity: .45; cursor: default; }
.pager { margin-left: auto; display: flex; gap: 6px; align-items: center; color: var(--muted); font-size: 12px; }
table { width: 100%; border-collapse: collapse; font-size: 13px; table-layout: fixed; }
th { text-align: left; font-weight: 600; color: var(--muted); font-size: 12px; padding: 4px 6px;
  border-bottom: 1px solid var(--line); }
td { padding: 5px 6px; border-bottom: 1px solid var(--line); white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.id, td.cmd, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
tr.job { cursor: pointer; } tr.job:hover { background: var(--hover); }
tr.selected { background: var(--hover); box-shadow: inset 3px 0 var(--pending); }
.badge { display: inline-block; padding: 0 8px; border-radius: 9px; font-size: 12px; line-height: 18px;
  color: #fff; background: var(--c, var(--muted)); }
.alive { --c: var(--completed); } .stopping { --c: var(--failed); } .gone { --c: var(--dead); }
.running { --c: var(--processing); } .lost, .stopped, .canceled { --c: var(--muted); }
.open { --c: var(--completed); } .full { --c: var(--processing); }
.muted { color: var(--muted); }
.empty { color: var(--muted); text-align: center; padding: 14px; }
dl { display: grid; grid-template-columns: 110px minmax(0, 1fr); gap: 3px 10px; margin: 0; font-size: 13px; }
dt { color: var(--muted); } dd { margin: 0; overflow-wrap: anywhere; }
#jobtitle { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 15px;
  overflow-wrap: anywhere; margin-bottom: 8px; }
.actions { display: flex; gap: 8px; margin: 10px 0 0; }
button.retry { border-color: var(--completed); color: var(--completed); }
button.cancel, button.delete { border-color: var(--dead); color: var(--dead); }
details { margin: 6px 0; } summary { cursor: pointer; font-size: 12px; color: var(--muted); }
pre { margin: 4px 0 0; max-height: 260px; overflow: auto; background: var(--code); color: var(--codefg);
  padding: 8px 10px; border-radius: 6px; font-size: 12px; white-space: pre-wrap; overflow-wrap: anywhere; }
.w8 { width: 8%; } .w9 { width: 9%; } .w10 { width: 10%; } .w11 { width: 11%; } .w12 { width: 12%; }
.w14 { width: 14%; } .w15 { width: 15%; } .w17 { width: 17%; } .w18 { width: 18%; } .w22 { width: 22%; }
.w24 { width: 24%; }
.link { border: 0; background: none; padding: 0; color: var(--pending); font-family: ui-monospace, monospace;
  font-size: 12px; }
</style>
</head>
<body>
<header><h1>queuectl</h1><span id="paused"></span><span id="live">connecting…</span></header>
<div id="banner" role="alert" hidden></div>
<main>
  <section id="counts" class="card wide" aria-label="jobs per state">
    <div class="count pending"><div class="n" id="n-pending">–</div><div class="label">pending</div></div>
    <div class="count processing"><div class="n" id="n-processing">–</div><div class="label">processing</div></div>
    <div class="count completed"><div class="n" id="n-completed">–</div><div class="label">completed</div></div>
    <div class="count failed"><div class="n" id="n-failed">–</div><div class="label">failed</div></div>
    <div class="count dead"><div class="n" id="n-dead">–</div><div class="label">dead</div></div>
    <div class="count workers"><div class="n" id="n-workers">–</div><div class="label">live workers</div></div>
  </section>
  <section class="card wide">
    <h2>Throughput, last hour (runs finished per minute)</h2>
    <div class="legend"><span class="completed">completed</span><span class="failed">failed</span>
      <span class="dead">dead</span></div>
    <div id="throughput">
      <svg id="chart" viewBox="0 0 720 180" role="img" aria-label="runs per minute"></svg>
      <div id="stats"></div>
    </div>
  </section>
  <section class="card">
    <h2>Jobs</h2>
    <div class="filters">
      <select id="state" aria-label="state">
        <option value="">all states</option><option value="pending">pending</option>
        <option value="processing">processing</option><option value="completed">completed</option>
        <option value="failed">failed</option><option value="dead">dead</option>
      </select>
      <input id="queue" placeholder="queue (all)" aria-label="queue" size="14" spellcheck="false">
      <button id="retryall" class="retry" hidden>Retry all dead</button>
      <div class="pager"><span id="range"></span><button id="prev">‹ newer</button>
        <button id="next">older ›</button></div>
    </div>
    <table>
      <colgroup><col class="w18"><col class="w11"><col class="w10"><col class="w9">
        <col class="w12"><col class="w11"><col></colgroup>
      <thead><tr><th>id</th><th>state</th><th>queue</th><th class="num">attempts</th><th>due</th><th>updated</th>
        <th>command</th></tr></thead>
      <tbody id="jobs"><tr><td colspan="7" class="empty">loading…</td></tr></tbody>
    </table>
  </section>
  <section class="card" id="jobview">
    <h2>Job</h2>
    <p id="jobhint" class="muted">Select a job in the table to see its fields, runs and output.</p>
    <div id="jobdetail" hidden>
      <div id="jobtitle"></div>
      <dl id="fields"></dl>
      <div id="actions" class="actions"></div>
      <h3>Runs</h3>
      <table>
        <colgroup><col class="w8"><col class="w22"><col class="w15"><col class="w17">
          <col class="w10"><col></colgroup>
        <thead><tr><th>#</th><th>started</th><th class="num">duration</th><th>outcome</th><th class="num">exit</th>
          <th>error</th></tr></thead>
        <tbody id="runs"></tbody>
      </table>
      <div id="outputs"></div>
    </div>
  </section>
  <section class="card wide">
    <h2>Queues</h2>
    <table>
      <colgroup><col class="w22"><col class="w11"><col class="w11"><col class="w11"><col class="w11">
        <col class="w11"><col class="w10"><col></colgroup>
      <thead><tr><th>queue</th><th class="num">pending</th><th class="num">processing</th>
        <th class="num">completed</th><th class="num">failed</th><th class="num">dead</th><th class="num">limit</th>
        <th>status</th></tr></thead>
      <tbody id="queues"></tbody>
    </table>
  </section>
  <section class="card wide">
    <h2>Workers</h2>
    <table>
      <colgroup><col class="w15"><col class="w8"><col class="w8"><col class="w8"><col class="w12">
        <col class="w10"><col class="w15"><col></colgroup>
      <thead><tr><th>host</th><th class="num">pid</th><th>version</th><th class="num">threads</th>
        <th class="num">heartbeat age</th><th>status</th><th>queues</th><th>jobs</th></tr></thead>
      <tbody id="workers"></tbody>
    </table>
  </section>
  <section class="card wide">
    <h2>Schedules</h2>
    <table>
      <colgroup><col class="w14"><col class="w12"><col class="w12"><col class="w15">
        <col class="w24"><col class="w10"><col></colgroup>
      <thead><tr><th>id</th><th>schedule</th><th>zone</th><th>next slot</th><th>last job</th><th>state</th>
        <th>command</th></tr></thead>
      <tbody id="schedules"></tbody>
    </table>
  </section>
</main>
<script nonce="{{NONCE}}">
"use strict";
const $ = (selector) => document.querySelector(selector);
const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
const NEEDS_TOKEN = meta("queuectl-needs-token") === "1", ACTIONS = meta("queuectl-actions") === "1";
const STATES = ["pending", "processing", "completed", "failed", "dead"], OUTCOMES = ["completed", "failed", "dead"];
const PAGE = 25, REFRESH_MS = 1500, TAIL_CHARS = 16384, QUEUE_NAME = /^[A-Za-z0-9._-]{0,64}$/;
const view = { state: "", queue: "", offset: 0, job: null, closed: new Set(), paused: [], pausedExcept: [] };
const drawn = {};  // the JSON each panel last drew: an unchanged panel is left alone

// The token: the printed URL brings it in the fragment (#token=T, optionally &job=ID), which no browser
// sends to a server. It moves to sessionStorage, kept by a reload of this tab and by no other origin
// (another port is another origin), and out of the address bar. Never a cookie: a browser would send
// that to every server on this host, whatever its port.
let token = takeToken();
function takeToken() {
  const match = /^#token=([^&]*)&?(.*)$/.exec(location.hash);
  if (match) history.replaceState(null, "", location.pathname + (match[2] ? "#" + match[2] : ""));
  try {
    if (match) sessionStorage.setItem("queuectl-token", match[1]);
    return sessionStorage.getItem("queuectl-token") || "";
  } catch {  // storage refused (a browser setting): this visit works, a reload needs the URL again
    return match ? match[1] : "";
  }
}

// DOM builders. Children that are strings become text nodes: nothing from the API is parsed as HTML.
function h(tag, props, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children.filter((c) => c !== null && c !== undefined).map((c) => (c instanceof Node ? c : String(c))));
  return node;
}
function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  node.append(...children.map(String));
  return node;
}
const badge = (word, cls) => h("span", { className: "badge " + (cls || word) }, word);
function changed(key, value) {
  const json = JSON.stringify(value);
  if (drawn[key] === json) return false;
  drawn[key] = json;
  return true;
}

// Formatting
// Times as the CLI shows them: UTC with a Z (the API's own strings, cut), the date only when not today's.
const hhmm = (iso) => `${iso.slice(11, 16)}Z`;
function when(iso) {
  if (!iso) return "–";
  const time = `${iso.slice(11, 19)}Z`;
  return iso.slice(0, 10) === new Date().toISOString().slice(0, 10) ? time : `${iso.slice(0, 10)} ${time}`;
}
function secs(v) {
  if (v === null || v === undefined) return "–";
  return v < 1 ? `${Math.round(v * 1000)} ms` : v < 120 ? `${v.toFixed(2)} s` : `${(v / 60).toFixed(1)} min`;
}
const bytes = (n) => {  // as the CLI writes sizes (size_text): 512 B, 64 KiB, 14.2 MiB
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = n, unit = 0;
  while (unit < 3 && +value.toFixed(1) >= 1024) { value /= 1024; unit += 1; }
  return unit ? `${+value.toFixed(1)} ${units[unit]}` : `${n} B`;
};
const num = (n) => Number(n).toLocaleString("en-US");
// As `queuectl list`: ATTEMPTS counts the run going on or the one that completed; DUE says what a job waits for.
const attempts = (j) => (`${j.attempts + (["processing", "completed"].includes(j.state) ? 1 : 0)}/`
  + Math.max(j.max_retries, 1));
// As is_paused: '*' pauses every queue but those of paused_except.
const isPaused = (queue) => !view.pausedExcept.includes(queue) && (view.paused.includes("*")
  || view.paused.includes(queue));
function due(j) {
  if (!["pending", "failed"].includes(j.state)) return "–";
  if (j.waiting_on) return `after ${j.waiting_on} job${j.waiting_on === 1 ? "" : "s"}`;
  const left = (Date.parse(j.next_run_at) - Date.now()) / 1000;
  if (left <= 0) return isPaused(j.queue) ? "paused" : "now";
  if (left >= 86400) return j.next_run_at;
  if (left <= 59) return `in ${Math.ceil(left)}s`;  // rounded up, as due_text: never "in 60s" or "in 60m"
  const minutes = Math.ceil(left / 60);
  return minutes < 60 ? `in ${minutes}m` : `in ${Math.floor(minutes / 60)}h ${minutes % 60}m`;
}

// The API
async function api(path, method = "GET") {
  const res = await fetch(path, { method, cache: "no-store", headers: { "X-Queuectl-Token": token } });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(body.error || `HTTP ${res.status}`), { status: res.status });
  return [body, res];
}
function setBanner(message) {
  $("#banner").hidden = !message;
  $("#banner").textContent = message || "";
}
const reloadJobs = () => loadJobs().catch((e) => setBanner(e.message));

// Counts
async function loadStatus() {
  const [status] = await api("/api/status");
  for (const state of STATES) $("#n-" + state).textContent = num(status.jobs[state]);
  $("#n-workers").textContent = num(status.active_workers);
  const paused = view.paused = status.paused, except = view.pausedExcept = status.paused_except;
  $("#paused").textContent = !paused.length ? "" : "paused: " + (!paused.includes("*") ? paused.join(", ")
    : "all queues" + (except.length ? " except " + except.join(", ") : ""));
  for (const option of $("#state").options) {
    option.textContent = option.value ? `${option.value} (${num(status.jobs[option.value])})` : "all states";
  }
}

// Throughput chart and stats
async function loadChart() {
  const [[throughput], [stats]] = await Promise.all([api("/api/throughput"), api("/api/stats")]);
  if (changed("chart", [throughput, $("#chart").getBoundingClientRect().width])) drawChart(throughput.buckets);
  if (changed("stats", stats)) drawStats(stats);
}
function niceMax(v) {
  const p = 10 ** Math.floor(Math.log10(Math.max(v, 2)));
  return [2, 4, 6, 8, 10].map((m) => m * p).find((m) => m >= v);
}
function drawChart(buckets) {
  const chart = $("#chart"), W = Math.max(320, Math.round(chart.getBoundingClientRect().width)), H = 180;
  const left = 34, bottom = 20, top = 8;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);  // one unit a pixel: text is never stretched
  const max = niceMax(Math.max(...buckets.map((b) => b.completed + b.failed + b.dead)));
  const scale = (H - top - bottom) / max, width = (W - left) / buckets.length;
  const nodes = [];
  for (const value of [0, max / 2, max]) {
    const y = H - bottom - value * scale;
    nodes.push(svg("line", { x1: left, x2: W, y1: y, y2: y, class: "grid" }),
               svg("text", { x: left - 5, y: y + 4, "text-anchor": "end" }, num(value)));
  }
  buckets.forEach((b, i) => {
    const group = svg("g", {}, );
    group.append(svg("title", {}, `${hhmm(b.at)}  ${b.completed} completed, ${b.failed} failed, ${b.dead} dead`));
    group.append(svg("rect", { x: left + i * width, y: top, width, height: H - top - bottom, fill: "transparent" }));
    let y = H - bottom;
    for (const outcome of OUTCOMES) {
      const height = b[outcome] * scale;
      if (height <= 0) continue;
      y -= height;
      group.append(svg("rect", { x: left + i * width + 1, y, width: Math.max(1, width - 2), height, class: outcome }));
    }
    nodes.push(group);
  });
  for (const i of [0, 15, 30, 45]) {
    if (i < buckets.length) nodes.push(svg("text", { x: left + i * width, y: H - 4 }, hhmm(buckets[i].at)));
  }
  nodes.push(svg("text", { x: W, y: H - 4, "text-anchor": "end" }, "now"));
  $("#chart").replaceChildren(...nodes);
}
function drawStats(s) {
  const line = (label, value) => h("div", {}, h("span", { className: "muted" }, label), h("b", {}, value));
  $("#stats").replaceChildren(
    line("throughput", `${s.throughput_per_min}/min`),
    ...OUTCOMES.map((k) => line(k, num(s.runs[k]))),
    line("duration p50 / p95", `${secs(s.duration_s.p50)} / ${secs(s.duration_s.p95)}`),
    line("duration max", secs(s.duration_s.max)),
    line("wait p50 / p95", `${secs(s.wait_s.p50)} / ${secs(s.wait_s.p95)}`),
    line("oldest waiting", secs(s.oldest_eligible_age_s)));
}

// Job table
async function loadJobs() {
  const query = new URLSearchParams({ state: view.state, queue: view.queue, limit: PAGE, offset: view.offset });
  const [jobs, res] = await api("/api/jobs?" + query);
  const total = Number(res.headers.get("X-Total-Count"));
  if (view.offset > 0 && view.offset >= total) {  // the page emptied (jobs deleted): show the last one
    view.offset = Math.max(0, Math.ceil(total / PAGE) - 1) * PAGE;
    return loadJobs();
  }
  $("#range").textContent = total ? `${num(view.offset + 1)}–${num(view.offset + jobs.length)} of ${num(total)}` : "";
  $("#prev").disabled = view.offset === 0;
  $("#next").disabled = view.offset + jobs.length >= total;
  $("#retryall").textContent = "Retry all dead" + (view.queue ? ` in ${view.queue}` : "");
  const dues = jobs.map(due);
  if (!changed("jobs", [jobs, dues, view.job])) return;
  const rows = jobs.map((j, i) => h("tr",
    { className: "job" + (j.id === view.job ? " selected" : ""), onclick: () => selectJob(j.id) },
    h("td", { className: "id" }, j.id), h("td", {}, badge(j.state)), h("td", {}, j.queue),
    h("td", { className: "num" }, attempts(j)), h("td", {}, dues[i]), h("td", {}, when(j.updated_at)),
    h("td", { className: "cmd" }, j.command)));
  $("#jobs").replaceChildren(...(rows.length ? rows
    : [h("tr", {}, h("td", { colSpan: 7, className: "empty" }, "no jobs"))]));
}

// Job view
function selectJob(id) {
  view.job = id;
  history.replaceState(null, "", "#job=" + encodeURIComponent(id));
  drawn.job = null;
  loadJob().catch((e) => setBanner(e.message));
  reloadJobs();
}
async function loadJob() {
  const id = view.job;
  if (id === null) return;
  let job = null;
  try {
    [job] = await api("/api/jobs/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  if (id === view.job && changed("job", [id, job])) drawJob(id, job);
}
function drawJob(id, job) {
  $("#jobhint").hidden = true;
  $("#jobdetail").hidden = false;
  $("#jobtitle").textContent = id;
  if (!job) {
    $("#fields").replaceChildren(h("dd", { className: "muted" }, "This job no longer exists."));
    for (const part of ["#actions", "#runs", "#outputs"]) $(part).replaceChildren();
    return;
  }
  $("#fields").replaceChildren(...jobFields(job).flatMap(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
  $("#actions").replaceChildren(...actionButtons(job));
  $("#runs").replaceChildren(...(job.runs.length ? job.runs.slice().reverse().map(runRow)
    : [h("tr", {}, h("td", { colSpan: 6, className: "empty" }, "not run yet"))]));
  $("#outputs").replaceChildren(...job.runs.slice().reverse().map(runOutput));
  for (const pre of document.querySelectorAll("#outputs pre")) pre.scrollTop = pre.scrollHeight;
}
function jobFields(j) {
  const none = (v) => (v === null || v === undefined || v === "" ? "–" : v);
  return [
    ["state", badge(j.state)], ["queue", j.queue], ["priority", j.priority],
    ["command", h("span", { className: "mono" }, j.command)],
    ["attempts", attempts(j).replace("/", " of ")], ["timeout", j.timeout ? secs(j.timeout) : "none"],
    ["cwd", h("span", { className: "mono" }, j.cwd)], ["env", h("span", { className: "mono" }, JSON.stringify(j.env))],
    ["created", when(j.created_at)], ["updated", when(j.updated_at)], ["due", due(j)],
    ["next run at", when(j.next_run_at)],
    ["last error", none(j.last_error)], ["exit code", none(j.exit_code)], ["worker", none(j.worker_id)],
    ["runs", j.run_count], ["lost", j.lost_count], ["depends on", none(j.depends_on.join(", "))],
    ["waiting on", j.waiting_on],
  ];
}
function runRow(r) {
  const took = r.duration_s !== null ? secs(r.duration_s)
    : secs(Math.max(0, (Date.now() - Date.parse(r.started_at)) / 1000));
  return h("tr", {}, h("td", {}, r.run), h("td", {}, when(r.started_at)), h("td", { className: "num" }, took),
    h("td", {}, r.outcome ? badge(r.outcome) : badge("running")), h("td", { className: "num" }, r.exit_code ?? "–"),
    h("td", {}, r.error ?? ""));
}
function runOutput(r) {
  const key = `${view.job}\\n${r.run}`;
  const text = r.output === null || r.output === "" ? "(no output)"
    : r.output.length > TAIL_CHARS ? "[… earlier output not shown …]\\n" + r.output.slice(-TAIL_CHARS) : r.output;
  const details = h("details", { open: !view.closed.has(key) },
    h("summary", {}, `run ${r.run} output, ${r.output_bytes > r.output_kept_bytes
      ? `last ${bytes(r.output_kept_bytes)} of ${bytes(r.output_bytes)}` : bytes(r.output_bytes)}`
      + (r.ended_at ? "" : " (running)")),
    h("pre", {}, text));
  details.addEventListener("toggle", () => (details.open ? view.closed.delete(key) : view.closed.add(key)));
  return details;
}
function actionButtons(job) {
  if (!ACTIONS) return [];
  const buttons = [];
  if (job.state === "dead") buttons.push(actionButton(job.id, "retry", "Retry"));
  if (["pending", "failed", "processing"].includes(job.state)) buttons.push(actionButton(job.id, "cancel", "Cancel"));
  if (["completed", "dead"].includes(job.state)) buttons.push(actionButton(job.id, "delete", "Delete"));
  return buttons;
}
function actionButton(id, action, label) {
  return h("button", { className: action, onclick: async () => {
    if (action !== "retry" && !confirm(`${label} job ${id}?`)) return;
    try {
      await api(`/api/jobs/${encodeURIComponent(id)}/${action}`, "POST");
      setBanner("");
    } catch (e) {
      setBanner(`${label} failed: ${e.message}`);
    }
    drawn.job = drawn.jobs = null;
    update();
  } }, label);
}

// Workers
async function loadWorkers() {
  const [workers] = await api("/api/workers");
  if (!changed("workers", [workers, view.job])) return;
  const rows = workers.map((w) => {
    const jobs = h("td", {});
    w.jobs.forEach((id, i) => jobs.append(i ? ", " : "",
      h("button", { className: "link", onclick: () => selectJob(id) }, id)));
    if (!w.jobs.length) jobs.append(h("span", { className: "muted" }, "idle"));
    const status = !w.alive ? badge("dead?", "gone") : w.stopping ? badge("stopping") : badge("alive");
    return h("tr", {}, h("td", {}, w.host), h("td", { className: "num" }, w.pid),
      h("td", w.version ? {} : { className: "muted" }, w.version || "-"), h("td", { className: "num" }, w.threads),
      h("td", { className: "num" }, `${w.heartbeat_age_s.toFixed(1)} s`), h("td", {}, status),
      h("td", w.queues ? {} : { className: "muted" }, w.queues ? w.queues.join(", ") : "all"), jobs);
  });
  $("#workers").replaceChildren(...(rows.length ? rows
    : [h("tr", {}, h("td", { colSpan: 8, className: "empty" },
                     "no workers registered (start one: queuectl worker start)"))]));
}

// Schedules: the next slot, and the last job with its state (click it to open it)
async function loadSchedules() {
  const [schedules] = await api("/api/schedules");
  if (!changed("schedules", schedules)) return;
  const rows = schedules.map((s) => {
    const last = !s.last_job_id ? h("span", { className: "muted" }, "none yet")
      : h("button", { className: "link", onclick: () => selectJob(s.last_job_id) }, s.last_job_id);
    const state = s.last_job_id ? badge(s.last_job_state || "deleted", s.last_job_state || "gone") : "";
    const spec = s.cron || `every ${s.every}s`, next = s.paused ? badge("paused", "stopping") : when(s.next_run_at);
    return h("tr", {}, h("td", { className: "id" }, s.id), h("td", { className: "mono" }, spec), h("td", {}, s.tz),
      h("td", {}, next), h("td", {}, last), h("td", {}, state), h("td", { className: "cmd" }, s.job.command));
  });
  $("#schedules").replaceChildren(...(rows.length ? rows
    : [h("tr", {}, h("td", { colSpan: 7, className: "empty" }, "no schedules (add one: queuectl schedule add)"))]));
}

// Queues: what `queuectl queues` prints
async function loadQueues() {
  const [queues] = await api("/api/queues");
  if (!changed("queues", queues)) return;
  const rows = queues.map((q) => h("tr", {}, h("td", {}, q.queue),
    ...STATES.map((s) => h("td", { className: "num" }, q.jobs[s])),
    h("td", { className: "num" }, q.limit === null ? "-" : q.limit),
    h("td", {}, q.paused ? badge("paused", "failed") : q.limit !== null && q.jobs.processing >= q.limit
      ? badge("full") : badge("open"))));
  $("#queues").replaceChildren(...(rows.length ? rows
    : [h("tr", {}, h("td", { colSpan: 8, className: "empty" }, "no queues yet"))]));
}

// Refresh loop: every panel every REFRESH_MS, with fetch; the page never reloads.
async function update() {
  const results = await Promise.allSettled([loadStatus(), loadChart(), loadJobs(), loadQueues(), loadWorkers(),
                                            loadSchedules(), loadJob()]);
  const failure = results.find((r) => r.status === "rejected");
  setBanner(failure ? failure.reason.message : "");
  $("#live").textContent = failure ? "not updating" : `live, updated ${when(new Date().toISOString())}`;
  $("#live").classList.toggle("down", Boolean(failure));
}
async function loop() {
  if (NEEDS_TOKEN && !token) noToken();
  else if (!document.hidden) await update();
  setTimeout(loop, REFRESH_MS);
}
function noToken() {  // a bare URL (a new tab, a bookmark): say how to get in rather than poll for 403s
  setBanner("This tab has no access token: open the URL that `queuectl dashboard` printed (it ends in #token=…).");
  $("#live").textContent = "no token";
  $("#live").classList.add("down");
}
function jobFromHash() {
  const match = /^#job=(.*)$/.exec(location.hash);
  try { return match ? decodeURIComponent(match[1]) : null; } catch { return null; }
}

$("#state").onchange = (e) => { view.state = e.target.value; view.offset = 0; reloadJobs(); };
$("#queue").oninput = (e) => {
  const ok = QUEUE_NAME.test(e.target.value);
  e.target.classList.toggle("invalid", !ok);
  if (ok) { view.queue = e.target.value; view.offset = 0; reloadJobs(); }
};
$("#retryall").hidden = !ACTIONS;
$("#retryall").onclick = async () => {
  const which = view.queue ? ` of queue ${view.queue}` : "";
  if (!confirm(`Retry every dead job${which}, with the dead jobs they depend on?`)) return;
  try {
    await api("/api/dlq/retry?" + new URLSearchParams({ queue: view.queue }), "POST");
    setBanner("");
  } catch (e) {
    setBanner(`Retry all dead failed: ${e.message}`);
  }
  drawn.job = drawn.jobs = null;
  update();
};
$("#prev").onclick = () => { view.offset = Math.max(0, view.offset - PAGE); reloadJobs(); };
$("#next").onclick = () => { view.offset += PAGE; reloadJobs(); };
window.addEventListener("hashchange", () => {
  if (location.hash.startsWith("#token=")) {  // the printed URL pasted into this tab: no reload happens
    token = takeToken();
    update();
  }
  const id = jobFromHash();
  if (id !== null && id !== view.job) selectJob(id);
});
view.job = jobFromHash();
loop();
</script>
</body>
</html>
"""


# ==== CLI ========================================================================================

class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A value such as -1h is a value, not an option (argparse takes only -1 and -1.5 as numbers), so
        # `stats --since -1h` is refused for what it is rather than as a missing argument.
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str):
        raise UsageError(message)

    def _check_value(self, action, value) -> None:
        """A mistyped command or choice gets the nearest one, as a mistyped field or config key does."""
        if action.choices is not None and value not in action.choices:
            hint = did_you_mean(value, action.choices)
            if hint:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r} {hint}")
        super()._check_value(action, value)


class _Deferred:
    """Records calls (add_argument, set_defaults, add_subparsers, …) to replay them on a real parser later."""

    def __init__(self):
        self._calls = []

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)

        def record(*args, **kwargs):
            result = _Deferred()  # stands for what the real call returns, e.g. the subparsers of add_subparsers
            self._calls.append((method, args, kwargs, result))
            return result
        return record

    def replay(self, target) -> None:
        for method, args, kwargs, result in self._calls:
            result.replay(getattr(target, method)(*args, **kwargs))


class _LazyParser(_Deferred):
    """A command's parser, built only when the command line names that command: building all of them
    (each looking up gettext translations and the terminal size) costs every command start-up time
    (figures in DECISIONS.md). The top-level help and the "invalid choice" error need only the names and
    help strings, which argparse keeps in the subparsers action itself."""

    def __init__(self, **kwargs):
        super().__init__()
        self._kwargs = kwargs

    def parse_known_args(self, args, namespace):
        """The one method argparse calls on a chosen subcommand's parser."""
        parser = Parser(**self._kwargs)
        self.replay(parser)
        return parser.parse_known_args(args, namespace)


def build_parser() -> Parser:
    """The whole command line."""
    p = Parser(prog="queuectl", usage="queuectl [-h] [--version] [--db DB] [--json] COMMAND ...", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"queuectl {__version__}")
    p.add_argument("--db", help="database file, or postgresql://USER@HOST:PORT/DBNAME?schema=NAME "
                   "(default: $QUEUECTL_DB or ./queuectl.db); also after the command")
    p.add_argument("--json", action="store_true", help="print JSON only, for a command that has --json; "
                   "also after the command")
    # The commands are listed once, in the description; argparse's own list would repeat them.
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_LazyParser,
                           help=argparse.SUPPRESS, prog="queuectl")
    _add_job_commands(sub)
    _add_view_commands(sub)
    _add_operating_commands(sub)
    _add_dashboard_command(sub)
    _add_worker_commands(sub.add_parser("worker", help="start, stop or list workers").add_subparsers(
        dest="action", required=True, metavar="ACTION"))
    _add_dlq_and_config(sub)
    _add_completion_command(sub)
    _add_schedule_commands(sub.add_parser("schedule", help="recurring jobs").add_subparsers(
        dest="action", required=True, metavar="ACTION"))
    sub.add_parser("help", help="a command's help, as COMMAND --help", description="a command's help, as COMMAND "
                   "--help; without one, queuectl's").add_argument(
        "topic", nargs="*", metavar="COMMAND", help="a command, and its action for worker, dlq, config and schedule")
    return p


def _command(sub, name: str, func, help: str, *, json_flag: bool = False, ids: str | None = None,
             reads: bool = False, check=None, epilog: str | None = None):
    """Add a subcommand bound to `func`, with --db, the common --json flag and ID arguments; `reads`: it
    never writes, so it works on a database this user may only read, and a missing one is not created
    (see open_store); `check(args)` validates the arguments before the database is opened, so invalid
    input creates nothing; `epilog`: text after the options."""
    cmd = sub.add_parser(name, help=help, description=help, epilog=epilog,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    if ids:
        cmd.add_argument("ids" if ids == "+" else "id", nargs=ids if ids == "+" else None, metavar="ID")
    # Global options after the command too. SUPPRESS: a value given before the command is kept unless
    # repeated after it (a default here would overwrite it); given in both places, the later one wins.
    cmd.add_argument("--db", default=argparse.SUPPRESS, help="the database, as `queuectl --db DB COMMAND`")
    if json_flag:
        cmd.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON only")
    cmd.set_defaults(func=func, reads_only=reads, check=check, json_flag=json_flag, opens_store=True)
    return cmd


def job_fields_help() -> str:
    """`enqueue --help`'s list of the JSON fields and their defaults (the README's table, short)."""
    retries, timeout = CONFIG["max_retries"][0], CONFIG["job_timeout"][0]
    return f"""JSON fields (default):
  command      required: run by /bin/sh -c
  id           16 random hex characters
  queue        {DEFAULT_QUEUE}
  priority     0; among due jobs, higher runs first
  max_retries  config max-retries ({retries}): the runs before the DLQ
  timeout      config job-timeout ({timeout}; 0 = none): a duration, e.g. 90, 30s, 15m
  run_at       now: ISO-8601 (no offset: local time) or Unix seconds
  delay        0: a duration from now (not with run_at)
  depends_on   []: ids of jobs that must complete first
  env          {{}}: {{"NAME": "VALUE", ...}}
  cwd          the current folder: an absolute path
  on_dead      config on-dead: a shell command run as a job of its own if this job dies ("" = none)"""


RUN_EXIT_CODES_HELP = """exit codes:
  the job's own     when it completed or ended dead; 128+N: killed by signal N
  124               its timeout killed it (as timeout(1))
  125               it ended without an exit code of its own: canceled, lost too often, could not start, a
                    dependency died (as timeout(1): the command could not be run)
  130               interrupted (Ctrl+C): on a terminal it asks whether to cancel the job, else cancels it
  1, 2              run itself failed, or its input is invalid (nothing enqueued)"""


SCHEDULE_FIELDS_HELP = """JSON fields (default):
  id           required (update: ID, if given): its jobs are ID@SLOT
  cron         one of cron and every: five fields (minute hour day month weekday) or @hourly, @daily, ...
  every        one of cron and every: a duration, e.g. 30s, 15m, 2h, 1d
  tz           this machine's zone: an IANA name such as Europe/Berlin, in which cron is read
  overlap      skip: no job for a slot while the last one is unfinished; or allow
  command, max_retries, timeout, cwd, env, priority, queue, on_dead
               the template of its jobs, as for enqueue (queuectl help enqueue)"""


def _add_job_commands(sub) -> None:
    e = _command(sub, "enqueue", cmd_enqueue, "add a job, or with '-' a batch from stdin", json_flag=True,
                 check=check_enqueue, epilog=job_fields_help())
    e.add_argument("job", metavar="JSON", help="a job object, or - to read JSON Lines or a JSON array from stdin")
    _progress_flag(e)
    _add_add_command(sub)
    c = _command(sub, "cancel", cmd_cancel, "cancel jobs: waiting ones go to the DLQ, running ones are killed",
                 check=check_bulk)
    _bulk_arguments(c, "every job that has not finished")
    _command(sub, "delete", cmd_delete, "remove jobs that are not processing, with their runs", ids="+")
    pg = _command(sub, "purge", cmd_purge, "remove finished jobs and their runs; needs --older-than, --state or both",
                  check=check_purge)
    pg.add_argument("--state", choices=(COMPLETED, DEAD), default=None,
                    help="which finished jobs (default completed)")
    pg.add_argument("--older-than", type=_unit_duration_arg, default=None, metavar="DURATION",
                    help="only those last changed longer ago than this, with its unit: 90s, 15m, 12h, 7d, 1w "
                         "(default: any age)")
    _progress_flag(pg)
    wt = _command(sub, "wait", cmd_wait, "block until the jobs, or with --all a whole queue, are completed or dead",
                  reads=True, check=check_bulk)
    _bulk_arguments(wt, "until no job is pending, failed or processing (scheduled for later counts as unfinished)")
    wt.add_argument("--timeout", type=_duration_arg, default=None, metavar="DURATION",
                    help="give up after this long (exit 1), e.g. 90, 30s, 15m")
    _progress_flag(wt)


def _add_add_command(sub) -> None:
    add_job_options(_command(sub, "add", cmd_add, "add a job from a command line, without JSON: add [OPTIONS] -- "
                             "COMMAND [ARG...]", json_flag=True, check=check_add))
    r = _command(sub, "run", cmd_run, "add a job and wait for it as if it ran here (its output, retries, exit "
                 "code): run [OPTIONS] -- COMMAND [ARG...]", check=check_add, epilog=RUN_EXIT_CODES_HELP)
    add_job_options(r)  # every option of add's, one added later too
    r.add_argument("--burst", action="store_true", help="when no live worker serves its queue, run it here "
                   "(this job only, in its turn)")


def add_job_options(a) -> None:
    """`add`'s options and command words, which `run` takes too."""
    # REMAINDER: everything from the first word of the command on is the command, options included.
    a.add_argument("words", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]",
                   help="one word: a shell command as written ('make -j4 && make install'); several: run as "
                        "exactly that argument list (quoted with shlex.join)")
    a.add_argument("--id", help="the job's id (default: a random one)")
    a.add_argument("--queue", help=f"queue (default {DEFAULT_QUEUE})")
    a.add_argument("--priority", type=_int_arg(-MAX_PRIORITY, MAX_PRIORITY), metavar="N",
                   help="higher runs first (default 0)")
    a.add_argument("--max-retries", type=_int_arg(0, MAX_RETRIES_LIMIT), metavar="N",
                   help="runs before the DLQ (default: config max-retries)")
    a.add_argument("--timeout", metavar="DURATION", help="kill a run after this long, e.g. 90, 30s, 15m (0 = none)")
    a.add_argument("--delay", metavar="DURATION", help="run no sooner than this from now, e.g. 90, 15m, 2h, 1d")
    a.add_argument("--run-at", metavar="TIME", help="run no sooner than this ISO-8601 time (local without offset) "
                   "or Unix time")
    a.add_argument("--depends-on", action="append", default=[], metavar="ID",
                   help="run after this job completed; repeat it for more")
    a.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set a variable; repeatable")
    a.add_argument("--cwd", metavar="DIR", help="folder to run in (default: the current one)")
    a.add_argument("--on-dead", metavar="CMD", help="a shell command run as a job of its own if this job dies "
                   "(default: config on-dead; '' for none)")


def _progress_flag(cmd) -> None:
    cmd.add_argument("--no-progress", action="store_true", help="no live progress line on a terminal")


def _add_view_commands(sub) -> None:
    s = _command(sub, "status", cmd_status, "job counts, live workers, paused queues", json_flag=True, reads=True)
    s.add_argument("--queue", type=_queue_arg, help="only the jobs of this queue")
    s.add_argument("--watch", action="store_true", help="redraw every second until Ctrl+C")
    ls = _command(sub, "list", cmd_list, "list jobs, oldest first", json_flag=True, reads=True, check=check_list)
    ls.add_argument("--state", help=f"one of {', '.join(STATES)}")
    ls.add_argument("--queue", type=_queue_arg, help="only the jobs of this queue")
    ls.add_argument("--limit", type=_int_arg(0, UNBOUNDED), default=None, metavar="N",
                    help="only the N most recently created")
    _command(sub, "show", cmd_show, "one job in full, with its runs", json_flag=True, ids="1", reads=True)
    lg = _command(sub, "logs", cmd_logs, "output of the job's latest run (or run N)", ids="1", reads=True)
    lg.add_argument("--run", type=_int_arg(1, UNBOUNDED), default=None, metavar="N",
                    help="the output of run N (1 is the first; default: the latest)")
    lg.add_argument("--follow", "-f", action="store_true", help="stream a running job's output until it ends")
    st = _command(sub, "stats", cmd_stats, "throughput, durations and waits over a window", json_flag=True,
                  reads=True)
    st.add_argument("--since", type=_window_arg, default=3600, metavar="DURATION",
                    help="window, e.g. 900, 15m, 1d, 1w (default 1h)")
    _command(sub, "metrics", cmd_metrics, "the queue's gauges in Prometheus text format (for a textfile collector)",
             reads=True)


def _add_operating_commands(sub) -> None:
    for name, func, verb in (("pause", cmd_pause, "stop claiming from"), ("resume", cmd_resume, "claim again from")):
        cmd = _command(sub, name, func, f"workers {verb} these queues (all, if none named)")
        cmd.add_argument("--queue", type=_queue_arg, action="append", default=[],
                         help="this queue; repeat it for more (default: every queue)")
    lm = _command(sub, "limit", cmd_limit, "at most N jobs of a queue processing at once, on all workers; "
                  "without arguments, list the limits", json_flag=True, check=check_limit)
    lm.add_argument("queue", nargs="?", type=_queue_arg, metavar="QUEUE")
    lm.add_argument("max_running", nargs="?", metavar="N", help="a number from 1, or none to remove the limit")
    _command(sub, "queues", cmd_queues, "every queue with jobs, a limit or a pause: counts, paused, limit",
             json_flag=True, reads=True)


def _add_dashboard_command(sub) -> None:
    d = _command(sub, "dashboard", cmd_dashboard, "serve a live web view of the queue and its JSON API", reads=True,
                 check=check_dashboard)
    d.add_argument("--bind", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default 127.0.0.1)")
    d.add_argument("--port", type=_int_arg(0, 65535), default=8321, help="port (default 8321; 0 = any free port)")
    d.add_argument("--allow-actions", action="store_true", help="allow retry, cancel and delete from the page")
    d.add_argument("--no-token", action="store_true", help="serve without the access token (trusted machines only)")


def _add_worker_commands(w) -> None:
    ws = _command(w, "start", cmd_worker_start, "run a worker in the foreground")
    ws.add_argument("--count", type=_int_arg(1, 256), default=1, help="threads, each running one job at a time")
    ws.add_argument("--burst", action="store_true", help="exit once the due work is drained")
    ws.add_argument("--queue", type=_queue_arg, action="append", default=[],
                    help="claim only from this queue; repeat it for more (default: every queue)")
    ws.add_argument("--quiet", "-q", action="store_true",
                    help="log only starts, stops, failures, deaths and recoveries (not each job claimed or completed)")
    ws.add_argument("--log-format", choices=("text", "json"), default="text",
                    help="text lines (default), or one JSON object a line for log shippers")
    wt = _command(w, "stop", cmd_worker_stop, "ask every running worker to stop gracefully", check=check_worker_stop)
    wt.add_argument("--wait", action="store_true", help="return once they have exited")
    wt.add_argument("--timeout", type=_duration_arg, default=None, metavar="DURATION",
                    help="with --wait: give up after this long, e.g. 90, 30s, 15m")
    _command(w, "list", cmd_worker_list, "registered workers and what they run", json_flag=True, reads=True)


def _add_dlq_and_config(sub) -> None:
    d = sub.add_parser("dlq", help="the dead-letter queue").add_subparsers(dest="action", required=True)
    _command(d, "list", cmd_dlq_list, "dead jobs", json_flag=True, reads=True)
    r = _command(d, "retry", cmd_dlq_retry, "move dead jobs back to pending", check=check_bulk)
    _bulk_arguments(r, "every dead job, with the dead jobs it depends on (in any queue)")
    c = sub.add_parser("config", help="settings").add_subparsers(dest="action", required=True)
    cs = _command(c, "set", cmd_config_set, "set a value", check=config_setting)
    cs.add_argument("key", help=f"one of {', '.join(k.replace('_', '-') for k in CONFIG)}")
    # REMAINDER: a value such as "-1d" would otherwise be taken for an option and reported as a
    # missing value; cmd_config_set checks there is exactly one and names a bad one.
    cs.add_argument("value", nargs=argparse.REMAINDER, help="the value (one): the keys in seconds take a duration "
                    "(90, 15m, 2h, 1d, 1w), output-limit a size (65536, 64K, 1M)")
    _command(c, "get", cmd_config_get, "print a value", reads=True,
             check=lambda args: config_key(args.key)).add_argument("key")
    _command(c, "list", cmd_config_list, "every value", json_flag=True, reads=True)


def _add_completion_command(sub) -> None:
    """`completion SHELL`: not through _command, as it has no database to name (see COMPLETION_SCRIPTS)."""
    text = "print the shell completion script of bash, zsh or fish (install lines in the README)"
    c = sub.add_parser("completion", help=text, description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("shell", choices=tuple(COMPLETION_SCRIPTS), metavar="SHELL", help="bash, zsh or fish")
    c.set_defaults(func=cmd_completion, reads_only=True, check=None, json_flag=False, opens_store=False)


def _bulk_arguments(cmd, every: str) -> None:
    """IDs, or --all [--queue Q]: the arguments of a command that acts on many jobs (see check_bulk)."""
    cmd.add_argument("ids", nargs="*", metavar="ID")
    cmd.add_argument("--all", action="store_true", help=every)
    cmd.add_argument("--queue", type=_queue_arg, help="with --all: only the jobs of this queue")


def _add_schedule_commands(s) -> None:
    a = _command(s, "add", cmd_schedule_add, "add a schedule: a JSON object with id, cron or every, and a job template",
                 check=check_schedule, epilog=SCHEDULE_FIELDS_HELP)
    a.add_argument("schedule", metavar="JSON")
    _command(s, "list", cmd_schedule_list, "every schedule, its next slot and its last job", json_flag=True,
             reads=True)
    n = _command(s, "next", cmd_schedule_next, "the next slots of a schedule, or of an expression without storing it",
                 reads=True, check=check_schedule_next)
    n.add_argument("id", nargs="?", metavar="ID", help="a stored schedule (or give --cron or --every)")
    n.add_argument("--cron", metavar="EXPR", help="a cron expression to try, e.g. '30 2 * * mon-fri'; opens no database")
    n.add_argument("--every", metavar="DURATION", help="an interval to try (30s, 15m, 2h, 1d, 1w), as if added now")
    n.add_argument("--tz", metavar="ZONE", help="with --cron: the IANA zone it is read in (default this machine's)")
    n.add_argument("--count", type=_int_arg(1, 10_000), default=5, metavar="N", help="how many (default 5)")
    n.add_argument("--after", type=_time_arg, default=None, metavar="TIME",
                   help="ISO-8601 (no offset: local time) or Unix seconds (default now)")
    u = _command(s, "update", cmd_schedule_update, "replace a schedule's expression, zone, overlap and job template "
                 "(its last job stays; slots already passed do not fire)", ids="1", check=check_schedule,
                 epilog=SCHEDULE_FIELDS_HELP)
    u.add_argument("schedule", metavar="JSON", help="the object `schedule add` takes; an id in it must be ID")
    _command(s, "pause", cmd_schedule_pause, "stop making jobs from these schedules", ids="+")
    _command(s, "resume", cmd_schedule_resume, "make jobs again, from the next slot on (missed slots do not fire)",
             ids="+")
    _command(s, "remove", cmd_schedule_remove, "delete schedules (the jobs they made stay)", ids="+")


def cli_time(text: str, what: str = "") -> float | str:
    """A time typed on a command line as the JSON field `run_at` takes it: a NUMBER is Unix seconds
    (checked here, so an error shows it as typed), anything else an ISO-8601 string (for parse_time)."""
    return float(parse_number(text, what, 0, MAX_UNIX_TIME)) if NUMBER.fullmatch(text) else text


def _time_arg(text: str) -> float:
    """A command line's time: ISO-8601, or digits for Unix seconds."""
    try:
        return parse_time(cli_time(text), "--after")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int_arg(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from low to high (parse_number); a bad one is argparse's error."""
    def integer(text: str) -> int:
        try:
            return parse_number(text, "", low, high, integer=True)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return integer


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _unit_duration_arg(text: str) -> float:
    """A duration that must name its unit: where a bare number deletes (purge), 7 may have meant 7 days."""
    seconds = _duration_arg(text)  # first: a negative one is no duration in any unit
    if NUMBER.fullmatch(text.strip()) and seconds != 0:  # 0 is 0 in any unit
        raise argparse.ArgumentTypeError(f"{shown(text)} has no unit: seconds or days? Give one: "
                                         f"{text.strip()}s, {text.strip()}h, {text.strip()}d")
    return seconds


def _window_arg(text: str) -> float:
    """A window of time to look back over: longer than 0."""
    if text.strip().startswith("-") or _duration_arg(text) == 0:
        raise argparse.ArgumentTypeError(f"the window must be longer than 0: {shown(text)} "
                                         "(e.g. 90s, 15m, 1h, 1d)")
    return _duration_arg(text)


def _queue_arg(text: str) -> str:
    try:
        return valid_queue(text, "a queue name")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def open_store(args) -> Store:
    """The Store named by --db, $QUEUECTL_DB or ./queuectl.db (a file, or a postgresql:// URL)."""
    path = args.db if args.db is not None else os.environ.get("QUEUECTL_DB", "queuectl.db")
    if not _valid_text(path, "--db"):
        raise UsageError("the database path (--db or $QUEUECTL_DB) is empty")
    if path == ":memory:" or path.startswith("file:"):  # SQLite's own names: a queue must be a file
        raise UsageError(f"--db {path!r} is not a file path")
    if not is_postgres(path) and not os.path.isabs(path) and not _cwd_exists():
        raise BadDatabase(f"cannot open {path}: the current folder no longer exists (give --db a full path)")
    # The dashboard only reads unless its actions are on.
    try:
        return open_database(path, reads_only=args.reads_only and not getattr(args, "allow_actions", False))
    except NoQueue as e:  # most often the wrong folder or a typo in --db: say so, and answer as an empty queue
        print(f"queuectl: note: {e}", file=sys.stderr)
        return EmptyStore(path)


def reopened(store: Store) -> Store:
    """For a command that watches: the real Store once the queue an EmptyStore stands in for exists."""
    if not isinstance(store, EmptyStore):
        return store
    try:
        real = open_database(store.target, reads_only=True)
    except NoQueue:
        return store
    store.close()
    return real


def _cwd_exists() -> bool:
    try:
        os.getcwd()
        return True
    except OSError:
        return False


def config_key(name: str) -> str:
    """Normalise a config key (hyphens or underscores); UsageError listing the valid keys."""
    key = name.replace("-", "_")
    if key not in CONFIG:
        keys = [k.replace("_", "-") for k in CONFIG]
        hint = did_you_mean(name.replace("_", "-"), keys) or f"(valid: {', '.join(keys)})"
        raise UsageError(f"unknown config key {name!r} {hint}")
    return key


# -- text for a terminal ---------------------------------------------------------------------------
# What a person reads is printed through printable() (see UNSAFE_TEXT).


def json_text(value, **options) -> str:
    """json.dumps with non-ASCII kept, and the characters printable() escapes that json.dumps leaves raw
    (DEL, C1, separators, bidi controls) written as \\u escapes: the same JSON value, safe on a terminal."""
    return UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", json.dumps(value, ensure_ascii=False, **options))


def emit_json(value) -> None:
    print(json_text(value, indent=2))


def print_ids(ids: list[str]) -> None:
    """One id a line: what enqueue, cancel, delete and dlq retry print. Ids are checked at input (see
    _valid_id), so printable() changes only one written into the database behind queuectl's back."""
    sys.stdout.write("".join(f"{printable(i)}\n" for i in ids))


def checked_ids(ids: list[str]) -> list[str]:
    """Command-line job ids, validated, duplicates dropped, order kept."""
    return list(dict.fromkeys(_valid_id(i, "ID") for i in ids))


def _on_ids_or_all(args, store: Store, on_all, on_ids) -> None:
    """`--all` (of `--queue`): on_all(queue, now); else on_ids(ids, now) on the ids named. Prints the ids
    acted on, one a line."""
    if args.all:
        return print_ids(on_all(args.queue, store.now()))
    ids = checked_ids(args.ids)
    on_ids(ids, store.now())
    print_ids(ids)


MIN_COMMAND_COLUMNS = 20  # on a terminal, the least of a command `list` shows, however long the ids


def print_table(header: list[str], rows: list[list[str]], right: tuple[int, ...] = ()) -> None:
    """Printable cells under a header, each column as wide as its widest cell (so an id is never cut),
    those in `right` aligned right. The last column, a command, is cut to fit the terminal; printed to a
    pipe or a file it is whole (a script reads every character)."""
    widths = [max(text_width(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    room = terminal_columns(sys.stdout)
    lines = []
    for row in (header, *rows):
        cells = [_padded(cell, width, i in right) for i, (cell, width) in enumerate(zip(row, widths))]
        last = row[-1]
        if room is not None:  # too little room left (long ids): cut to a few words, and the line wraps
            last = _fitted(last, max(room - sum(widths) - len(widths), MIN_COMMAND_COLUMNS))
        lines.append(" ".join(cells + [last]).rstrip() + "\n")
    sys.stdout.write("".join(lines))


def _fitted(text: str, width: int) -> str:
    """`text` in at most `width` terminal columns, blanks squeezed, cut with … only if wider: never padded
    (a $COLUMNS of any size is taken at its word)."""
    text = " ".join(text.split())
    return _cell(text, width).rstrip() if text_width(text) > width else text


def _padded(cell: str, width: int, right: bool) -> str:
    fill = " " * (width - text_width(cell))
    return fill + cell if right else cell + fill


def text_width(text: str) -> int:
    """The columns a terminal draws `text` in: a wide character takes two, a combining one none (_columns)."""
    return len(text) if text.isascii() else sum(_columns(c) for c in text)


def terminal_columns(stream) -> int | None:
    """The width of the terminal `stream` writes to ($COLUMNS first, as shutil reads it); None when it
    writes to no terminal."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):  # no isatty, or closed
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 1:
        return int(columns)
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return columns if columns > 1 else 80  # a pseudo-terminal nobody sized reports 0


# -- progress ------------------------------------------------------------------------------------

class Progress:
    """One live line on stderr for long work, redrawn in place at most four times a second and erased by
    close() (or the end of a `with`), so only the command's result stays. It is on only when stderr is a
    terminal, without --no-progress, QUEUECTL_NO_PROGRESS=1 or TERM=dumb: off, it writes nothing."""
    REDRAW_S = 0.25
    RATE_WINDOW_S = 10.0  # rate() measures over about this long, once it has a second of counts

    def __init__(self, on: bool, stream=None, clock=time.monotonic):
        self.on, self.stream, self.clock = on, stream if stream is not None else sys.stderr, clock
        self.drawn_at: float | None = None  # when the line was last drawn; None: never
        self.visible = False
        self.counts: list[tuple[float, int]] = []  # (clock, count) for rate()

    @classmethod
    def for_command(cls, args) -> "Progress":
        """A Progress on this process's stderr, on where the user wants it (see the class)."""
        on = (not getattr(args, "no_progress", False) and sys.stderr.isatty()
              and os.environ.get("QUEUECTL_NO_PROGRESS", "") in ("", "0") and os.environ.get("TERM") != "dumb")
        return cls(on)

    @property
    def drawn(self) -> bool:
        """Whether the line was ever drawn."""
        return self.drawn_at is not None

    def show(self, text: str) -> None:
        """Draw `text` as the line, unless the last drawing is less than REDRAW_S old."""
        if not self.on:
            return
        now = self.clock()
        if self.drawn_at is not None and now - self.drawn_at < self.REDRAW_S:
            return
        # To column 0, the text truncated to the width (a wrapped line could not be redrawn in place), and
        # ESC [ K erases what a longer earlier text left to the right.
        self._write("\r" + printable(text)[:self._columns() - 1] + "\x1b[K")
        self.drawn_at, self.visible = now, True

    def close(self) -> None:
        """Erase the line."""
        if self.visible:
            self._write("\r\x1b[K")
            self.visible = False

    def note(self, text: str) -> None:
        """A line on stderr that stays, whether the live line is on or off (erased first, drawn again
        by the next show())."""
        self.close()
        self.drawn_at = None
        self._write(text + "\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()  # before main() prints an error line, and on Ctrl+C

    def rate(self, count: int) -> float | None:
        """Per second, how fast `count` grew over the last RATE_WINDOW_S; None until a second has passed."""
        now = self.clock()
        self.counts.append((now, count))
        while len(self.counts) > 2 and now - self.counts[1][0] >= self.RATE_WINDOW_S:
            self.counts.pop(0)
        first_at, first = self.counts[0]
        return None if now - first_at < 1.0 else max(0.0, (count - first) / (now - first_at))

    def _columns(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return columns if columns > 1 else 80  # a pseudo-terminal nobody sized reports 0

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError):  # a terminal that went away must not fail the command itself
            self.stream.write(text)
            self.stream.flush()


def waiting_line(finished: int, total: int, dead: int, rate: float | None) -> str:
    """`wait`'s progress: `waiting: 312/1000 finished, 2 dead · 41/s · about 17s left` (rate and
    estimate once the rate is known, the estimate while the rate is above zero)."""
    line = f"waiting: {finished}/{total} finished, {dead} dead"
    if rate is None:
        return line
    line += f" · {rate:.0f}/s" if rate >= 10 else f" · {rate:.1f}/s"
    if rate > 0 and total > finished:
        line += f" · about {_about((total - finished) / rate)} left"
    return line


def _about(seconds: float) -> str:
    """A rough duration: 17s, 4m 05s, 2h 10m."""
    s = math.ceil(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


# -- jobs ----------------------------------------------------------------------------------------

def check_enqueue(args) -> None:
    """The job on the command line, checked against the default config: a typo creates no queue."""
    if args.job != "-":
        validate_job(job_json(args.job), config_defaults(), current_dir(), time.time())


def config_defaults() -> dict:
    """Every config key's default: what a check before the database is opened validates against."""
    return {key: default for key, (default, _) in CONFIG.items()}


def cmd_enqueue(args, store: Store) -> None:
    now, defaults, cwd = store.now(), store.config_all(), current_dir()
    if args.job != "-":
        return enqueue_and_print(store, [validate_job(job_json(args.job), defaults, cwd, now)], now, args.json)
    started, progress = time.monotonic(), Progress.for_command(args)
    if sys.stdin.isatty():  # else it would seem to hang, waiting for what was meant to be piped in
        print("queuectl: note: reading jobs, one JSON object a line, until Ctrl-D", file=sys.stderr, flush=True)
    with progress:
        specs, ids = enqueue_batch(store, progress, now, defaults, cwd)
    if not specs:
        print("queuectl: note: no jobs read", file=sys.stderr)
    print_enqueued(store, specs, ids, args.json, batch=True)
    if progress.drawn:  # a long batch on a terminal: its live line is gone, one line says how it went
        sys.stdout.flush()
        print(f"queuectl: enqueued {len(ids)} jobs in {time.monotonic() - started:.1f}s", file=sys.stderr)


def job_json(text: str) -> object:
    """`enqueue`'s argument parsed. Text that is no JSON at all is most often a command line: point to `add`."""
    try:
        return parse_json(text)
    except UsageError as e:
        if text.lstrip().startswith(("{", "[", '"')):
            raise
        import shlex
        words = text if shlex.join(text.split()) == text else shlex.quote(text)  # as the shell would take it
        raise UsageError(f"{e} (to enqueue a command line: queuectl add -- {words})") from None


def check_add(args) -> None:
    """`add`'s job, checked against the default config before the database is opened: a typo creates no queue."""
    validate_job(add_job_object(args), config_defaults(), current_dir(), time.time())


def cmd_add(args, store: Store) -> None:
    now = store.now()
    enqueue_and_print(store, [validate_job(add_job_object(args), store.config_all(), current_dir(), now)], now,
                      args.json)


def enqueue_and_print(store: Store, specs: list[dict], now: float, as_json: bool) -> None:
    """Enqueue one validated job; print its id, or the job with --json."""
    print_enqueued(store, specs, store.enqueue(specs, now), as_json)


def print_enqueued(store: Store, specs: list[dict], ids: list[str], as_json: bool, batch: bool = False) -> None:
    """Print the ids, or the jobs with --json (one object unless a batch); note a paused queue on stderr."""
    note_paused(store, [spec["queue"] for spec in specs])
    if as_json:
        jobs = [store.get(i).to_dict() for i in ids]
        return emit_json(jobs if batch else jobs[0])
    print_ids(ids)


def enqueue_batch(store: Store, progress: "Progress", now: float, defaults: dict, cwd: str) -> tuple[list, list]:
    """`enqueue -`: read, validate and store stdin's jobs (all or none); past BATCH_PROGRESS_LINES lines
    (or items of one JSON array) the progress line counts them. Returns the specs and their ids."""
    counts = {"read": 0, "validated": 0, "stored": 0}

    def count(**now_at):
        counts.update(now_at)
        if counts["read"] > BATCH_PROGRESS_LINES or counts["validated"] > BATCH_PROGRESS_LINES:
            progress.show("enqueue: read {read} lines · validated {validated} · stored {stored}".format(**counts))
    data = read_stdin(lambda lines: count(read=lines))
    if data.count(b"\n") >= BATCH_STREAM_LINES:
        jobs = validated_jobs(data, job_validator(defaults, cwd, now), count)
        specs = store.enqueue_streamed(jobs, now, check_batch, stored=lambda n: count(stored=n))
        if specs is not None:
            return specs, [spec["id"] for spec in specs]
        counts.update(validated=0, stored=0)
    specs = list(validated_jobs(data, job_validator(defaults, cwd, now), count))
    check_batch(specs)
    return specs, store.enqueue(specs, now, stored=lambda n: count(stored=n))


def validated_jobs(data: bytes, validate: Callable[[object], dict], count: Callable) -> Iterator[dict]:
    """Stdin's jobs validated in order, each spec with its "where" ("line 3"); `count(validated=n)` hears
    how many so far. UsageError names the first invalid one."""
    n = 0
    for n, (where, item) in enumerate(read_batch(data), start=1):
        try:
            spec = validate(item)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        spec["where"] = where
        yield spec
        if n % 1000 == 0:
            count(validated=n)
    count(validated=n)


def read_stdin(read: Callable[[int], None] = lambda lines: None) -> bytearray:
    """All of stdin's bytes; `read(lines)` hears how many lines have come so far, for a progress line."""
    data, lines = bytearray(), 0
    while chunk := sys.stdin.buffer.read1(1 << 20):
        data += chunk
        lines += chunk.count(b"\n")
        read(lines)
    return data


def note_paused(store: Store, queues: list[str]) -> None:
    """A note on stderr when jobs went into a paused queue: they wait, and nothing else would say why."""
    paused = store.paused()
    stuck = list(dict.fromkeys(q for q in queues if is_paused(q, paused)))
    if not stuck:
        return
    command = "queuectl resume " + " ".join(f"--queue {q}" for q in stuck)  # names are plain ASCII words
    if "*" in paused:
        return print(f"queuectl: note: {paused_text(*paused_names(paused))} are paused; jobs wait for `{command}` "
                     "(or `queuectl resume`, for all)", file=sys.stderr)
    which = f"queue {stuck[0]!r} is" if len(stuck) == 1 else f"queues {', '.join(map(repr, stuck))} are"
    print(f"queuectl: note: {which} paused; jobs wait for `{command}`", file=sys.stderr)


def add_job_object(args) -> dict:
    """`add`'s options and command line as the JSON object `enqueue` takes, so both are validated alike."""
    words = args.words[1:] if args.words[:1] == ["--"] else args.words
    if not words:
        raise UsageError(f"{args.command}: give the command after --, e.g. queuectl {args.command} -- make test")
    import shlex
    obj = {"command": words[0] if len(words) == 1 else shlex.join(words)}
    for field in ("id", "queue", "priority", "max_retries", "timeout", "delay", "on_dead"):
        if getattr(args, field) is not None:
            obj[field] = getattr(args, field)
    if args.run_at is not None:  # a Unix time, or an ISO-8601 string
        obj["run_at"] = cli_time(args.run_at, "--run-at")
    if args.cwd is not None:  # relative to the current folder here, where `enqueue` wants an absolute path
        obj["cwd"] = os.path.join(current_dir(), args.cwd) if current_dir() else args.cwd
    if args.depends_on:
        obj["depends_on"] = args.depends_on
    if args.env:
        obj["env"] = env_pairs(args.env)
    return obj


def env_pairs(pairs: list[str]) -> dict:
    """--env NAME=VALUE options as a dict; each name at most once."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--env wants NAME=VALUE: {pair!r}")
        if name in env:
            raise UsageError(f"--env {name} given twice")
        env[name] = value
    return env


def current_dir() -> str:
    """The default `cwd` of a job; a folder deleted under the shell gives a clear error."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return ""  # validate_job rejects it only for a job that does not name its own cwd


def read_batch(data: bytes) -> Iterator[tuple[str, object]]:
    """Stdin's jobs as (where, value): a JSON array's items as they are (a string item is not JSON to
    parse again), or JSON Lines' non-blank lines, each parsed when reached, so the first bad one is named."""
    try:
        body = data.decode("utf-8").removeprefix("\ufeff")  # a BOM, as some editors write
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"line {line}: stdin is not valid UTF-8") from None
    if body.lstrip().startswith("["):
        items = parse_json(body)
        if not isinstance(items, list):
            raise UsageError("stdin: expected one JSON array or JSON Lines")
        yield from ((f"item {n}", item) for n, item in enumerate(items, start=1))
        return
    # Only "\n" ends a line: str.splitlines() would also split at U+2028, U+0085 and others, which
    # JSON allows raw inside strings.
    scan = STRICT_JSON.scan_once  # what parse_json runs, less two Python calls a line
    for n, line in enumerate(body.split("\n"), start=1):
        line = line.removesuffix("\r")
        try:  # the common line: one object, no blank around it
            item, end = scan(line, 0)
            if end == len(line):
                yield f"line {n}", item
                continue
        except Exception:  # noqa: BLE001 - anything amiss: parse_json below says what, as it always did
            pass
        if line.strip():
            yield f"line {n}", _numbered(f"line {n}", lambda: parse_json(line))


def _numbered(where: str, fn):
    try:
        return fn()
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None


def check_batch(specs: list[dict]) -> None:
    """Ids unique within the batch; a dependency inside the batch must come earlier (so no cycles)."""
    ids = {spec["id"] for spec in specs}
    if len(ids) == len(specs) and not any(spec["depends_on"] for spec in specs):
        return  # the common batch: nothing the loop below could find
    seen: set[str] = set()
    for spec in specs:
        if spec["id"] in seen:
            raise UsageError(f"{spec['where']}: id {spec['id']!r} appears twice in the batch")
        later = next((d for d in spec["depends_on"] if d in ids and d not in seen), None)
        if later is not None:
            raise UsageError(f"{spec['where']}: depends on {later!r}, which does not come earlier in the batch")
        seen.add(spec["id"])


def check_bulk(args) -> None:
    """IDs or --all, not both; --queue only with --all."""
    name = command_name(args)
    if args.queue is not None and not args.all:  # checked first: `cancel --queue q` means the whole queue
        raise UsageError(f"{name}: --queue needs --all (`{name} --all --queue {args.queue}`)")
    if bool(args.ids) == args.all:
        raise UsageError(f"{name}: give job ids or --all" + (", not both" if args.all else ""))


def cmd_cancel(args, store: Store) -> None:
    _on_ids_or_all(args, store, store.cancel_all, store.cancel)


def cmd_delete(args, store: Store) -> None:
    ids = checked_ids(args.ids)
    store.delete(ids)
    print_ids(ids)


def check_purge(args) -> None:
    # A bare `purge` would delete every completed job at once: the user says which, or how old.
    if args.state is None and args.older_than is None:
        raise UsageError("purge needs --older-than DURATION or --state STATE (or both)")


def cmd_purge(args, store: Store) -> None:
    state = args.state or COMPLETED

    def purged(count: int) -> None:
        if count >= PURGE_SLICE:  # a full slice: more may follow, so the line is worth showing
            progress.show(f"purge: {count} {state} jobs deleted so far")
    with Progress.for_command(args) as progress:
        removed = store.purge_in_slices(state, store.now() - (args.older_than or 0), purged=purged)
    print(f"purged {removed} {state} job{'s' if removed != 1 else ''}")


def cmd_wait(args, store: Store) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    with Progress.for_command(args) as progress:
        if args.all:
            return wait_all(store, args.queue, deadline, progress)
        return wait_ids(store, checked_ids(args.ids), deadline, progress)


def wait_ids(store: Store, ids: list[str], deadline: float | None, progress: "Progress") -> int:
    """`wait ID…`: until every named job is completed or dead; 1 naming the dead ones, or at the deadline
    the unfinished ones."""
    unserved = UnservedNote(store, progress)
    while True:
        store.refresh()
        jobs = [store.get(i) for i in ids]
        dead = [j for j in jobs if j.state == DEAD]
        waiting = [j.id for j in jobs if j.state not in (COMPLETED, DEAD)]
        if not waiting:  # every one has finished, one way or the other
            if dead:
                raise QueueError("dead: " + "; ".join(f"job {j.id!r}: {j.last_error}" for j in dead))
            return EXIT_OK
        unserved.check(jobs)
        if deadline is not None and time.monotonic() > deadline:
            raise QueueError(f"timed out waiting for {', '.join(waiting)}")
        finished = len(jobs) - len(waiting)
        progress.show(waiting_line(finished, len(jobs), len(dead), progress.rate(finished)))
        time.sleep(WAIT_POLL_S)


class UnservedNote:
    """`wait ID`'s one note on stderr once no live worker has served a waited job's queue for
    WAIT_NO_WORKER_S: without it a forgotten worker looks like a slow one, forever."""

    def __init__(self, store: Store, progress: "Progress"):
        self.store, self.progress, self.served_at, self.said = store, progress, time.monotonic(), False

    def check(self, jobs: list[Job]) -> None:
        """Look again (until the note is said): the queues of the unfinished jobs (a processing one too:
        if its worker died, only a live worker of its queue takes it back)."""
        if self.said:
            return
        queues = unserved_queues(self.store, {j.queue for j in jobs if j.state not in (COMPLETED, DEAD)})
        if not queues:
            self.served_at = time.monotonic()
        elif time.monotonic() - self.served_at >= WAIT_NO_WORKER_S:
            self.said = True
            which = f"queue {queues[0]!r}" if len(queues) == 1 else f"queues {', '.join(map(repr, queues))}"
            self.progress.note(f"queuectl: note: no live worker serves {which}: start one with queuectl worker start")


def unserved_queues(store: Store, queues: set[str]) -> list[str]:
    """Those of `queues` no live worker serves, sorted (a worker started without --queue serves every queue)."""
    if not queues:
        return []
    served: set[str] = set()
    for w in live_workers(store):
        if not w.queues:
            return []
        served.update(json.loads(w.queues))
    return sorted(queues - served)


def wait_all(store: Store, queue: str | None, deadline: float | None, progress: "Progress") -> int:
    """`wait --all`: until no job (of `queue`) is pending, failed or processing, jobs enqueued meanwhile
    included; 1 if any job unfinished at the start ended dead (naming up to ten), or at the deadline."""
    answered, high = store.unfinished(queue)  # the seqs of the jobs whose end decides the exit code
    low = min(answered, default=0)

    def dead() -> list[str]:
        return [i for i, seq in store.dead_between(queue, low, high) if seq in answered] if answered else []
    dead_shown, dead_due = 0, -math.inf  # the line's count of dead, and when to read it again
    while True:
        store.refresh()
        unfinished, arrived = store.wait_counts(queue, high)
        if not unfinished:  # counted before reading the dead, so a job that just died is among them
            return _dead_verdict(dead(), len(answered))
        if deadline is not None and time.monotonic() > deadline:
            where = f" in queue {queue!r}" if queue is not None else ""
            raise QueueError(f"timed out: {unfinished} job{'s' if unfinished != 1 else ''}{where} still pending, "
                             "failed or processing")
        if progress.on:
            if progress.clock() >= dead_due:  # reads every dead job in the seq range: a big DLQ makes it
                began = progress.clock()  # slow, so the line spends at most a twentieth of the wait on it
                dead_shown = len(dead())
                dead_due = progress.clock() + 19 * (progress.clock() - began)
            total = max(len(answered) + arrived, unfinished)
            progress.show(waiting_line(total - unfinished, total, dead_shown, progress.rate(total - unfinished)))
        time.sleep(WAIT_POLL_S)


def _dead_verdict(dead: list[str], answered: int) -> int:
    """0 if none of the jobs `wait --all` answers for ended dead, else QueueError naming the first ten."""
    if not dead:
        return EXIT_OK
    named = ", ".join(repr(i) for i in dead[:10]) + (f" and {len(dead) - 10} more" if len(dead) > 10 else "")
    raise QueueError(f"{len(dead)} of the {answered} jobs waited for ended dead: {named}")


# -- views ---------------------------------------------------------------------------------------

def cmd_status(args, store: Store) -> None:
    if not args.watch:
        return print_status(store, args.queue, args.json)
    watched = store
    try:
        while True:
            watched = reopened(watched)  # a queue made while it is watched shows up
            watched.refresh()
            _watch_frame(watched, args.queue, args.json)
            time.sleep(1.0)
    except KeyboardInterrupt:
        if not args.json:
            print()
        raise  # 130, as for `logs -f` and `wait`: the user stopped it, it did not finish
    finally:
        if watched is not store:
            watched.close()


def _watch_frame(store: Store, queue: str | None, as_json: bool) -> None:
    """One refresh of `status --watch`: a JSON line with --json, redrawn text on a terminal, else a block."""
    if as_json:
        sys.stdout.write(json.dumps(status_dict(store, queue)) + "\n")
    elif sys.stdout.isatty():
        sys.stdout.write("\x1b[H" + _status_text(store, queue).replace("\n", "\x1b[K\n") + "\x1b[J")
    else:
        sys.stdout.write(_status_text(store, queue) + "\n")
    sys.stdout.flush()


def print_status(store: Store, queue: str | None, as_json: bool) -> None:
    if as_json:
        return emit_json(status_dict(store, queue))
    sys.stdout.write(_status_text(store, queue))


def _status_text(store: Store, queue: str | None) -> str:
    status = status_dict(store, queue)
    lines = [f"{state:<12}{status['jobs'][state]:>8}" for state in STATES]
    lines.append(f"{'workers':<12}{status['active_workers']:>8}")
    if status["paused"]:
        lines.append("paused: " + printable(paused_text(status["paused"], status["paused_except"])))
    return "\n".join(lines) + "\n"


def print_jobs(store: Store, jobs: list[Job], as_json: bool) -> None:
    if as_json:
        return emit_json([j.to_dict() for j in jobs])
    now, paused = store.now(), store.paused()
    rows = [[printable(j.id), j.state, "{}/{}".format(*attempts_shown(j)), printable(j.queue),
             due_text(j, now, paused), iso(j.updated_at), printable(j.command)] for j in jobs]
    print_table(["ID", "STATE", "ATTEMPTS", "QUEUE", "DUE", "UPDATED", "COMMAND"], rows, right=(2,))


def attempts_shown(job: Job) -> tuple[int, int]:
    """ATTEMPTS as people read it: the runs that count against the limit, the one running or the one
    that completed included (`attempts` counts failed runs only), over max(max_retries, 1)."""
    return job.attempts + (job.state in (PROCESSING, COMPLETED)), max(job.max_retries, 1)


def due_text(job: Job, now: float, paused: list[str]) -> str:
    """When a waiting job may run: 'now', 'in 4m', its time (UTC, as iso() writes it) a day or more ahead,
    'after 2 jobs' (dependencies not completed), 'paused' (due, in a paused queue); '-' if not waiting."""
    if job.state not in (PENDING, FAILED):
        return "-"
    if job.waiting_on:
        return f"after {job.waiting_on} job{'s' if job.waiting_on != 1 else ''}"
    left = job.next_run_at - now
    if left <= 0:
        return "paused" if is_paused(job.queue, paused) else "now"
    if left >= 86400:
        return iso(job.next_run_at)
    if left <= 59:  # rounded up, so never "in 60s" or "in 60m"
        return f"in {math.ceil(left)}s"
    minutes = math.ceil(left / 60)
    return f"in {minutes}m" if minutes < 60 else f"in {minutes // 60}h {minutes % 60}m"


def check_list(args) -> None:
    if args.state is not None and args.state not in STATES:
        raise UsageError(f"unknown state {args.state!r} (valid: {', '.join(STATES)})")


def cmd_list(args, store: Store) -> None:
    print_jobs(store, store.list_jobs(args.state, -1 if args.limit is None else args.limit, args.queue), args.json)


def cmd_show(args, store: Store) -> None:
    checked_ids([args.id])
    job = store.get(args.id)
    details = show_dict(store, args.id, job)
    if args.json:
        return emit_json(details)
    runs, output = details.pop("runs"), details.pop("output")
    due = due_text(job, store.now(), store.paused())
    for key, value in details.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(f"{key + ':':<13} {printable(shown)}")
        if key == "next_run_at":
            print(f"{'due:':<13} {due}")
    print(f"runs:         {len(runs)}")
    for r in runs:
        took = "running" if r["duration_s"] is None else f"{r['duration_s']:.2f}s"
        print(f"  #{r['run']:<3} {r['started_at']}  {took:>9}  {r['outcome'] or 'running':<10} "
              f"exit={r['exit_code']}  {printable(r['error'] or '')}".rstrip())
    note = truncated_note(runs[-1]) if runs else None
    print("output:" + ("" if output else " (none)") + (f" {note}" if note else ""))
    if output:  # its lines, but no control of the terminal: `logs` prints the bytes themselves
        print(printable(output, lines=True), end="" if output.endswith("\n") else "\n")


def cmd_logs(args, store: Store) -> None:
    checked_ids([args.id])
    run = store.run_output(args.id, args.run)
    if run is None and args.run is not None:
        raise NotFound(f"job {args.id!r} has no run {args.run}")
    if not args.follow:
        write_bytes(run[1] if run else None)
        return _note_truncated(run)
    if run is None:
        _note_not_started(store, store.get(args.id))
    follow_output(store, args.id, run)


def _note_not_started(store: Store, job: Job) -> None:
    """`logs -f` on a job with no run yet: one line on stderr saying what it waits for, or it would look hung."""
    if job.state in (PENDING, FAILED):
        print(f"queuectl: note: job {job.id!r} has not started: {job.state}, {held_by(store, job)}; "
              "its output will follow when it runs", file=sys.stderr, flush=True)


def held_by(store: Store, job: Job) -> str:
    """Why a waiting job does not run yet: 'due in 4m' (see due_text), 'waiting for 2 jobs it depends on',
    'held by its paused queue 'q'', 'held by queue 'q' at its limit of 2 running', or 'due now'."""
    now, paused = store.now(), store.paused()
    if job.waiting_on:
        return f"waiting for {job.waiting_on} job{'s' * (job.waiting_on != 1)} it depends on"
    if is_paused(job.queue, paused):
        return f"held by its paused queue {job.queue!r}"
    if job.next_run_at > now:
        return f"due {due_text(job, now, paused)}"
    limit = store.limits().get(job.queue)
    if limit is not None and store.counts(job.queue)[PROCESSING] >= limit:
        return f"held by queue {job.queue!r} at its limit of {limit} running"
    return "due now"


def _note_truncated(run: tuple | None) -> None:
    """One line on stderr when the run printed more than was kept: stdout stays exactly the kept bytes."""
    run_no, output, total, _ = run or (None, b"", 0, None)
    kept = len(output or b"")
    if total > kept:
        sys.stdout.flush()
        print(f"queuectl: note: run {run_no} printed {size_text(total)}; this is its last {size_text(kept)} "
              "(config output-limit)", file=sys.stderr)


def follow_output(store: Store, job_id: str, run: tuple | None, tick: Callable[[], None] = lambda: None) -> None:
    """Print a run's output as it grows, until it ends (waiting for a first run if there is none);
    `tick()` between two looks (`run`'s checks of who serves the queue)."""
    printed = 0
    while True:
        if run is not None:
            run_no, output, total, ended = run
            printed = _print_new(output or b"", total, printed)
            if ended is not None:
                return
        elif store.get(job_id).state in (COMPLETED, DEAD):
            return
        tick()
        time.sleep(0.25)
        store.refresh()
        run = store.run_output(job_id, None if run is None else run[0])


def _print_new(output: bytes, total: int, printed: int) -> int:
    """Write the part of a tail not printed yet; returns the new printed count."""
    new = total - printed
    if new > len(output):  # on stderr, as for `logs` without --follow: stdout is only the job's bytes
        sys.stdout.flush()
        print(f"queuectl: note: {size_text(new - len(output))} of output not kept here (config output-limit)",
              file=sys.stderr, flush=True)
    if new > 0:
        write_bytes(output[-min(new, len(output)):])
        sys.stdout.flush()
    return max(total, printed)


def write_bytes(data: bytes | None) -> None:
    """Job output as captured, bytes and all (decoded only when stdout has no byte layer)."""
    if not data:
        return
    if hasattr(sys.stdout, "buffer"):
        sys.stdout.flush()
        if isinstance(sys.stdout, Stdout):
            sys.stdout.write_bytes(data)
        else:
            sys.stdout.buffer.write(data)
    else:
        sys.stdout.write(output_text(data))


def cmd_stats(args, store: Store) -> None:
    report = stats_dict(store, args.since, store.now())
    if args.json:
        return emit_json(report)
    print(f"window: {args.since:g}s   throughput: {report['throughput_per_min']}/min")
    print("runs:     " + "  ".join(f"{k} {v}" for k, v in report["runs"].items()))
    print("duration: " + "  ".join(f"{k} {_secs(v)}" for k, v in report["duration_s"].items()))
    print("wait:     " + "  ".join(f"{k} {_secs(v)}" for k, v in report["wait_s"].items()))
    print(f"oldest eligible job waiting: {_secs(report['oldest_eligible_age_s'])}")


def cmd_metrics(args, store: Store) -> None:
    sys.stdout.write(metrics_text(store, store.now()))


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


# -- operating -----------------------------------------------------------------------------------

def cmd_pause(args, store: Store) -> None:
    note = unnamed_queues_note(store, args.queue)  # read before the pause names them
    store.pause(args.queue or ["*"])
    print("paused " + (", ".join(args.queue) if args.queue else "all queues"))
    if note:
        print(f"queuectl: note: {note}", file=sys.stderr)


def unnamed_queues_note(store: Store, queues: list[str]) -> str | None:
    """`pause`/`resume --queue`: the note on names no job, worker, limit or pause names (None if there are
    none), most often misspelt: a pause that stops nothing, or a resume that leaves the queue meant paused."""
    known = known_queues(store) if queues else set()
    unknown = [q for q in dict.fromkeys(queues) if q not in known]
    return unknown_queues_note(unknown, known, "no jobs, workers or limit yet") if unknown else None


def known_queues(store: Store) -> set[str]:
    """Every queue a job, a worker's --queue, a limit or a pause names (reads every job: for hints only)."""
    named = {q for w in store.workers() if w.queues for q in json.loads(w.queues)}
    named |= set(paused_names(store.paused())[0]) - {"*"}
    return named | {queue for queue, _, _ in store.queue_counts()} | set(store.limits())


def unknown_queues_note(unknown: list[str], known: set[str], lacking: str) -> str:
    """The note on queue names nothing else names, most often misspelt: "queue 'imgaes' has no jobs yet
    (did you mean 'images'?)", or "(is the name right?)" when no known name is near."""
    hints = " ".join(filter(None, (did_you_mean(q, known - {q}) for q in unknown))) or "(is the name right?)"
    many = len(unknown) > 1
    return f"queue{'s' * many} {', '.join(map(repr, unknown))} {'have' if many else 'has'} {lacking} {hints}"


def cmd_resume(args, store: Store) -> None:
    note = unnamed_queues_note(store, args.queue)
    store.resume(args.queue)
    print("resumed " + (", ".join(args.queue) if args.queue else "all queues"))
    if note:
        print(f"queuectl: note: {note}", file=sys.stderr)


def check_limit(args) -> None:
    args.change = args.max_running is not None  # else it only shows
    if args.change:
        args.max_running = valid_limit(args.max_running)
    if args.json and args.queue is not None:
        raise UsageError("limit --json lists every limit: it takes no QUEUE")


def valid_limit(text: str) -> int | None:
    """A queue limit from the command line: an integer from 1, or 'none' (None: no limit)."""
    if text == "none":
        return None
    return parse_number(text, "limit: N (or none)", 1, MAX_LIMIT, integer=True)


def cmd_limit(args, store: Store) -> None:
    if args.change:
        store.set_limit(args.queue, args.max_running)
    limits = store.limits()
    if args.queue is not None:
        return print(f"{args.queue}: {limits.get(args.queue, 'none')}")
    if args.json:
        return emit_json(limits)
    sys.stdout.write("".join(f"{printable(q)}: {n}\n" for q, n in limits.items()))


def cmd_queues(args, store: Store) -> None:
    rows = store.queues()
    if args.json:
        return emit_json(rows)
    names = [printable(r["queue"]) for r in rows]
    width = max([20] + [len(name) for name in names])  # names are ASCII, up to 64 characters
    print(f"{'QUEUE':<{width}} " + " ".join(f"{s.upper():>10}" for s in STATES) + f" {'LIMIT':>6}  PAUSED")
    for name, r in zip(names, rows):
        print(f"{name:<{width}} " + " ".join(f"{r['jobs'][s]:>10}" for s in STATES)
              + f" {'-' if r['limit'] is None else r['limit']:>6}  {'yes' if r['paused'] else 'no'}")


def worker_target(store: Store) -> str:
    """The --db of a worker this command starts: an absolute path, so its log names the file wherever it ran."""
    return store.target if is_postgres(store.target) else os.path.abspath(store.target)


def cmd_worker_start(args, store: Store) -> int:
    queues = tuple(dict.fromkeys(args.queue))
    empty = [q for q in queues if not any(store.counts(q).values())]
    if empty:  # most often a misspelt name: nothing would ever tell
        note = unknown_queues_note(empty, known_queues(store), "no jobs yet")
        if args.log_format == "json":  # the worker's stderr is then JSON Lines only
            log.warning("%s", note, extra=event("queue_has_no_jobs", queues=empty))
        else:
            print(f"queuectl: note: {note}", file=sys.stderr)
    store.close()
    worker = Worker(worker_target(store), args.count, args.burst, queues)
    worker.install_signals()
    return worker.run()


def check_worker_stop(args) -> None:
    if args.timeout is not None and not args.wait:
        raise UsageError("worker stop: --timeout needs --wait")


def cmd_worker_stop(args, store: Store) -> int:
    # A dead worker's row would only inflate the count; one that could not be asked would be waited for in vain.
    asked = set(store.request_stop(sorted(w.id for w in live_workers(store))))
    n = len(asked)
    print(f"asked {n} worker{'s' if n != 1 else ''} to stop")
    if not args.wait:
        return EXIT_OK
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while asked & {w.id for w in live_workers(store)}:
        if deadline is not None and time.monotonic() > deadline:
            raise QueueError("timed out waiting for workers to exit")
        time.sleep(0.1)
    return EXIT_OK


def cmd_worker_list(args, store: Store) -> None:
    rows = worker_dicts(store, store.now())
    if args.json:
        return emit_json(rows)
    print(f"{'ID':<32} {'HOST':<16} {'PID':>7} {'VERSION':<8} {'STARTED':<20} {'THREADS':>7} {'BEAT':>6}  "
          f"{'QUEUES':<16} JOBS")
    for r in rows:
        state = "" if r["alive"] else " (dead?)"
        queues = _short(printable(",".join(r["queues"])), 16) if r["queues"] else "(all)"
        jobs = printable(", ".join(r["jobs"])) or "-"
        version = _short(printable(r["version"]), 8) if r["version"] else "-"
        print(f"{printable(r['id']):<32} {printable(r['host']):<16} {r['pid']:>7} {version:<8} {r['started_at']:<20} "
              f"{r['threads']:>7} {r['heartbeat_age_s']:>5.1f}s  {queues:<16} {jobs}{state}")


def check_dashboard(args) -> None:
    if args.no_token and args.allow_actions and not loopback_bind(args.bind):
        raise UsageError(f"--no-token with --allow-actions on {args.bind!r}, which other machines can reach, "
                         "would let anyone on the network retry, cancel and delete jobs: drop --no-token, "
                         "or --bind 127.0.0.1")


def cmd_dashboard(args, store: Store) -> int:
    import secrets
    import signal
    store.close()  # each request opens its own connection
    dashboard = Dashboard(store.target, token=None if args.no_token else secrets.token_urlsafe(24),
                          allow_actions=args.allow_actions)
    server = dashboard.serve(args.bind, args.port)
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl+C or `kill`: a clean stop, exit 0 (set before the URL
        signal.signal(sig, signal.default_int_handler)  # is out; SIGINT starts ignored in a background job)
    try:
        _dashboard_notes(dashboard, args)  # before the URL: whoever waits for the URL has seen them
        print(dashboard.url(server), flush=True)
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print("queuectl: dashboard stopped", file=sys.stderr)
    finally:
        server.server_close()
    return EXIT_OK


def _dashboard_notes(dashboard: Dashboard, args) -> None:
    """What the person who started the dashboard should know, on stderr."""
    mode = "read-write (--allow-actions)" if args.allow_actions else "read-only"
    print(f"queuectl: dashboard for {dashboard.path}, {mode}; open the URL below; Ctrl+C stops it", file=sys.stderr)
    if not dashboard.loopback:
        print(f"queuectl: warning: listening on {args.bind}, reachable from other machines over plain HTTP"
              + ("; anyone who can reach it can read the queue (--no-token)" if args.no_token else ""),
              file=sys.stderr)


def cmd_dlq_list(args, store: Store) -> None:
    print_jobs(store, store.list_jobs(DEAD), args.json)


def cmd_dlq_retry(args, store: Store) -> None:
    _on_ids_or_all(args, store, store.retry_all_dead, store.retry_dead)


def cmd_config_set(args, store: Store) -> None:
    store.config_set(*config_setting(args))


def config_setting(args) -> tuple[str, float | int]:
    """`config set`'s (key, value), validated (also before the database is opened: a typo creates no queue)."""
    key = config_key(args.key)
    if len(args.value) != 1:
        raise UsageError(f"config set {args.key}: give exactly one value (got {len(args.value)})")
    try:
        return key, CONFIG[key][1](args.value[0])
    except UsageError as e:
        raise UsageError(f"config {args.key}: {e}") from None


def cmd_config_get(args, store: Store) -> None:
    print(printable(str(store.config_get(config_key(args.key)))))


def cmd_config_list(args, store: Store) -> None:
    values = {k.replace("_", "-"): v for k, v in store.config_all().items()}
    if args.json:
        return emit_json(values)
    for key, value in values.items():
        print(f"{key} = {printable(str(value))}")


# -- run: one job in the foreground --------------------------------------------------------------

def cmd_run(args, store: Store) -> int:
    now = store.now()
    spec = validate_job(add_job_object(args), store.config_all(), current_dir(), now)
    run = ForegroundRun(store, spec["id"], args.burst, now)
    with run.signals:
        try:  # from the enqueue on: a Ctrl-C just after its commit finds the job
            store.enqueue([spec], now)
            run.enqueued = True
            note_paused(store, [spec["queue"]])
            return run.follow()
        except KeyboardInterrupt:
            return run.interrupted()
        except Terminated as e:  # a kill, or its terminal closed: as a Ctrl-C without a terminal
            return run.cancel(128 + e.signum)
        except (BrokenPipeError, OutputLost) as e:
            raise run.output_lost(e) from None
        finally:
            run.signals.armed = False  # the job has ended, or was canceled or left: nothing more to do
            run.stop_worker()


class RunSignals:
    """`run`'s SIGTERM and SIGHUP (a kill; its terminal closed): the first raises Terminated in the main
    thread, as Ctrl-C raises KeyboardInterrupt, so that the job is canceled; later ones (a closing terminal
    sends two) do nothing, nor any once `armed` is off: the cancel and the worker's end go on. A SIGHUP
    ignored when run started (nohup) stays ignored. The handlers before are back at the end."""

    def __init__(self):
        self.armed, self.saved = True, {}

    def __enter__(self) -> "RunSignals":
        import signal
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) != signal.SIG_IGN:
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.armed:
            self.armed = False
            raise Terminated(signum)

    def __exit__(self, *exc) -> None:
        import signal
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


class ForegroundRun:
    """`run`'s wait for its job: every run's output on stdout as `logs -f` prints it, a line on stderr
    for each retry, the job's exit code once it completed or ended dead (see run_exit_code)."""

    def __init__(self, store: Store, job_id: str, burst: bool, created_at: float):
        self.store, self.job_id, self.burst = store, job_id, burst
        self.created_at, self.enqueued = created_at, False  # which job of that id is ours (see cancel)
        self.unserved = UnservedNote(store, Progress(False))  # `wait`'s note, said once
        self.due_since, self.turn_said = None, False  # see _note_turn
        self.followed = 0  # the number of the last run followed to its end
        self.failures = 0  # of the runs followed, those that failed: each counts an attempt (see failure_rule)
        self.worker: Worker | None = None  # --burst: the one this process runs for its job
        self.thread = None
        self.signals = RunSignals()

    def follow(self) -> int:
        """Until the job is completed or dead: each of its runs followed as it comes; its exit code."""
        while True:
            job = self.store.get(self.job_id)  # read before its runs: a job finished now shows its last run
            run = self.store.run_output(self.job_id, self.followed + 1)  # each in turn, however fast they came
            if run is not None:
                self.followed = run[0]
                follow_output(self.store, self.job_id, run, self.look)
                self.store.refresh()
                self._announce_retry()
                continue
            if job.state in (COMPLETED, DEAD):
                return run_exit_code(job, self.store.run_end(self.job_id, job.run_count))
            self.look(job)
            time.sleep(WAIT_POLL_S)
            self.store.refresh()

    def look(self, job: Job | None = None) -> None:
        """While waiting: with no live worker serving the job's queue, `wait`'s note, or with --burst a
        worker here for this job alone."""
        job = job or self.store.get(self.job_id)
        if self.worker is not None and not self.thread.is_alive():  # it said why; nothing here runs the job now
            raise QueueError(f"the worker here (--burst) has stopped; job {self.job_id} left queued: queuectl logs -f "
                             f"{self.job_id} follows it")
        if self.worker is not None:
            return self._note_turn(job)
        if self.burst and unserved_queues(self.store, {job.queue}):
            return self._start_worker(job.queue)
        self.unserved.check([job])

    def _note_turn(self, job: Job) -> None:
        """--burst: one note once its job has been due for WAIT_NO_WORKER_S and the worker here has not
        taken it: jobs ahead of it in its queue hold it, which that worker does not run."""
        if self.turn_said or job.state not in (PENDING, FAILED) or held_by(self.store, job) != "due now":
            self.due_since = None
        elif self.due_since is None:
            self.due_since = time.monotonic()
        elif time.monotonic() - self.due_since >= WAIT_NO_WORKER_S:
            self.turn_said = True
            say(f"queuectl: note: job {self.job_id} is due but not run: jobs ahead of it in queue {job.queue!r} wait "
                "for a worker (--burst runs this job only): start one with queuectl worker start")

    def _announce_retry(self) -> None:
        """A line on stderr when the run just followed ended and the job runs again: it failed with runs
        left, or its worker was lost or stopped. Told by the run's own record and the runs followed: by now
        the next run may have started, even ended, and the job's attempts be those of a later run."""
        job, run = self.store.get(self.job_id), self.store.run_end(self.job_id, self.followed)
        self.failures += run["outcome"] == FAILED
        last = job.run_count == self.followed  # no run after it yet: the job's state and due time are for the next
        if run["outcome"] not in (FAILED, "lost", "stopped") or (last and job.state == DEAD):
            return
        why = f"{run['outcome']}: {run['error']}" if run["error"] else run["outcome"]
        waiting = last and job.state in (PENDING, FAILED)
        due = f", due {due_text(job, self.store.now(), self.store.paused())}" if waiting else ""
        sys.stdout.flush()
        print(f"queuectl: run {self.followed} of job {self.job_id} {printable(why)}; it runs again "
              f"(attempt {self.failures + 1} of {max(job.max_retries, 1)}{due})", file=sys.stderr, flush=True)

    def _start_worker(self, queue: str) -> None:
        """--burst: a worker in this process, for this job only (see Store.claim), stopped when run ends.
        Logging is not set up here: only its warnings reach stderr, not a line for each claim."""
        import threading
        print(f"queuectl: note: no live worker serves queue {queue!r}: running job {self.job_id} here (--burst)",
              file=sys.stderr, flush=True)
        self.worker = Worker(worker_target(self.store), 1, False, (queue,), only=self.job_id)
        self.thread = threading.Thread(target=self.worker.run, name="burst worker", daemon=True)
        self.thread.start()

    def interrupted(self) -> int:
        """Ctrl-C: on a terminal, ask whether to cancel the job (a second Ctrl-C leaves it queued); without
        one, cancel it. 130 either way, but 128+N if signal N ends run during the question (see RunSignals)."""
        try:
            with contextlib.suppress(OSError, OutputLost):  # the question after the output; see output_lost
                sys.stdout.flush()
            if sys.stdin.isatty() and not ask_yes(f"queuectl: cancel job {self.job_id}? [y/N] "):
                self.leave("run interrupted")
                say(f"queuectl: job {self.job_id} left queued: queuectl logs -f {self.job_id} follows it")
                return EXIT_INTERRUPTED
        except Terminated as e:  # no answer can come now
            say("")  # ends the question's line
            return self.cancel(128 + e.signum)
        return self.cancel(EXIT_INTERRUPTED)

    def cancel(self, code: int) -> int:
        """Cancel the job, and say so; `code`. Interrupted before the enqueue returned, only if the job of
        that id is the one it enqueued (not one enqueued before with the same --id, which it refused)."""
        self.signals.armed = False  # decided: a SIGTERM or SIGHUP now must not cut the cancel short
        store = open_database(self.store.target)  # anew: the interrupt may have cut short a call on ours
        try:
            if self.enqueued or store.get(self.job_id).created_at == self.created_at:
                store.cancel([self.job_id], store.now())
                say(f"queuectl: job {self.job_id} canceled")
        except Conflict as e:  # it ended meanwhile
            say(f"queuectl: note: {e}")
        except NotFound:  # interrupted before the enqueue's commit: nothing to cancel
            pass
        finally:
            store.close()
        return code

    def leave(self, why: str) -> None:
        """Leave the job to the queue: with --burst, the one running here is killed and put back (it must
        not go on running in a process that is ending), as when its worker stops."""
        self.signals.armed = False  # decided (see cancel)
        if self.worker is not None:
            self.worker.hard_stop(why)

    def output_lost(self, error: OSError | OutputLost) -> QueueError:
        """stdout cannot be written (its reader left, a full disk): the error run exits 1 with. Not a
        success, and not a cancel either: the job goes on in the queue, which keeps its output."""
        self.signals.armed = False  # decided (see cancel), before the job is read
        if isinstance(error, OSError):  # BrokenPipeError, which Stdout lets through
            error = OutputLost(f"cannot write to standard output: {_errno_text(error.errno)}")
        if self.store.get(self.job_id).state in (COMPLETED, DEAD):  # its end is in the queue (`show`)
            return QueueError(str(error))
        self.leave("run's output cannot be written")
        return QueueError(f"{error}; job {self.job_id} left queued: queuectl logs -f {self.job_id} follows it")

    def stop_worker(self) -> None:
        """--burst: stop the worker here once its job ended (a canceled one once it is killed) and wait for it."""
        if self.worker is not None:
            self.worker._stop("run ended")
            self.thread.join()


def say(line: str) -> None:
    """A line on stderr, if it can be written: after a SIGHUP its terminal may be gone."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def ask_yes(question: str) -> bool:
    """Ask on stderr, read the answer from the terminal on stdin: True for y or yes; False for anything
    else, end of input or Ctrl-C."""
    try:
        sys.stderr.write("\n" + question)
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


def run_exit_code(job: Job, last_run: dict | None) -> int:
    """`run`'s exit code for its finished job: 0 if it completed; a dead job's last run's own exit code
    (128+N for a signal), EXIT_TIMED_OUT if its timeout killed it, else EXIT_NOT_RUN: canceled, lost
    too often, could not start, a dependency died (see the README's table)."""
    if job.state == COMPLETED:
        return EXIT_OK
    if last_run is None or last_run["outcome"] != DEAD or (job.last_error or "").startswith("canceled"):
        return EXIT_NOT_RUN
    if last_run["exit_code"] is not None:
        return last_run["exit_code"]
    return EXIT_TIMED_OUT if (last_run["error"] or "").startswith(TIMED_OUT) else EXIT_NOT_RUN


# -- schedules -----------------------------------------------------------------------------------

def cmd_schedule_add(args, store: Store) -> None:
    now = store.now()
    schedule = validate_schedule(parse_json(args.schedule), store.config_all(), current_dir(), now)
    store.add_schedule(schedule)
    print_ids([schedule.id])


def cmd_schedule_update(args, store: Store) -> None:
    store.update_schedule(validate_schedule(schedule_object(args), store.config_all(), current_dir(), store.now()))
    print_ids([args.id])


def schedule_object(args) -> object:
    """The JSON object of `schedule add`, or of `schedule update` with its ID (one in the object must match)."""
    obj = parse_json(args.schedule)
    if getattr(args, "id", None) is None or not isinstance(obj, dict):
        return obj
    schedule_id = _valid_id(args.id, "ID")
    if obj.get("id", schedule_id) != schedule_id:
        raise UsageError(f"field 'id' {shown(obj['id'])} is not the schedule updated, {schedule_id!r} "
                         "(to rename one, remove it and add it)")
    return {**obj, "id": schedule_id}


def check_schedule(args) -> None:
    """`schedule add` and `update`: the object checked against the default config, so a typo creates no queue."""
    validate_schedule(schedule_object(args), config_defaults(), current_dir(), time.time())


def cmd_schedule_list(args, store: Store) -> None:
    schedules = store.schedules()
    if args.json:
        return emit_json([s.to_dict() for s in schedules])
    rows = [[printable(s.id), printable(s.cron if s.cron else f"every {every_text(s.every_s)}"), printable(s.tz),
             s.overlap, *_next_slot_cells(s), _last_job_cell(s), printable(s.job["command"])] for s in schedules]
    print_table(["ID", "SCHEDULE", "TZ", "OVERLAP", "NEXT", "NEXT IN TZ", "LAST JOB", "COMMAND"], rows)


def _next_slot_cells(schedule: Schedule) -> list[str]:
    """NEXT, as the slot's job id will show it (UTC), and NEXT IN TZ, the wall time in the schedule's zone."""
    if schedule.paused or schedule.next_run_at is None:
        return ["paused" if schedule.paused else "-", "-"]
    try:
        wall = datetime.fromtimestamp(schedule.next_run_at, zone_of(schedule.tz)).isoformat(timespec="seconds")
    except (QueueError, OverflowError, ValueError):  # a zone unknown here; year 10000 on the zone's clock
        wall = "-"
    return [slot_text(schedule.next_run_at), wall]


def _last_job_cell(schedule: Schedule) -> str:
    if not schedule.last_job_id:
        return "-"
    return f"{printable(schedule.last_job_id)} ({schedule.last_job_state or 'gone'})"


def check_schedule_next(args) -> None:
    """A stored schedule's ID, or an expression (--cron, or --every), which needs no database: none is opened."""
    given = [name for name, value in (("ID", args.id), ("--cron", args.cron), ("--every", args.every))
             if value is not None]
    if len(given) != 1:
        raise UsageError("schedule next: give a schedule ID, --cron EXPR or --every DURATION"
                         + (f", not both {given[0]} and {given[1]}" if len(given) > 1 else ""))
    if args.tz is not None and args.cron is None:
        raise UsageError("--tz goes with --cron (a stored schedule has its zone, and --every needs none)")
    args.opens_store = args.id is not None


def cmd_schedule_next(args, store: Store | None) -> None:
    if store is None:  # --cron or --every
        now = time.time()
        schedule = expression_schedule(args.cron, args.every, args.tz, now)
    else:
        now = store.now()
        schedule = store.schedule(_valid_id(args.id, "ID"))
    after, slots = now if args.after is None else args.after, []
    while len(slots) < args.count and (after := next_slot(schedule, after)) is not None:
        slots.append(slot_text(after))
    print_ids(slots)


def cmd_schedule_pause(args, store: Store) -> None:
    ids = checked_ids(args.ids)
    store.pause_schedules(ids)
    print_ids(ids)


def cmd_schedule_resume(args, store: Store) -> None:
    ids = checked_ids(args.ids)
    store.resume_schedules(ids, store.now())
    print_ids(ids)


def cmd_schedule_remove(args, store: Store) -> None:
    ids = checked_ids(args.ids)
    store.remove_schedules(ids)
    print_ids(ids)


# -- shell completion ----------------------------------------------------------------------------
# `completion SHELL` prints a script; at each Tab it runs `queuectl __complete`, a hidden command (in no
# help, never completed) that walks build_parser()'s own parsers along the words typed and prints the values
# that fit the word under the cursor, one a line. Commands and options come from the parsers, so a new one
# completes with no change here; values from the queue come from bounded index reads (Store.complete_ids).

COMPLETE_COMMAND = "__complete"
COMPLETE_FILES = 3  # __complete's exit code for "file names here" (--db, --cwd, a command after `--`)
COMPLETE_BUSY_S = 0.05  # a completion gives up on a locked database at once (with no values): a prompt waits

COMPLETION_SCRIPTS = {
    "bash": r"""# queuectl completion for bash (no bash-completion package needed): eval "$(queuectl completion bash)"
_queuectl() {
    local prog=$1 out
    [[ $prog == "~/"* ]] && prog=$HOME/${prog:2}
    # The line up to the cursor, and readline's word ($2, which starts after the last COMP_WORDBREAKS
    # character, such as the ':' or '@' in an id): each value comes back without what precedes $2.
    out=$(command "$prog" __complete bash "${COMP_LINE:0:COMP_POINT}" "$2" 2>/dev/null)
    case $? in
        0) COMPREPLY=(); [[ -z $out ]] || mapfile -t COMPREPLY <<<"$out" ;;
        3) COMPREPLY=(); compopt -o default 2>/dev/null ;;
        *) COMPREPLY=() ;;
    esac
}
complete -F _queuectl queuectl
""",
    "zsh": r"""#compdef queuectl
# queuectl completion for zsh: source <(queuectl completion zsh), after compinit
_queuectl() {
    local out
    local -a values
    out=$(command ${(Q)words[1]} __complete zsh "${(@Q)words[2,CURRENT-1]}" "${(Q)PREFIX}" 2>/dev/null)
    case $? in
        0) values=("${(@f)out}"); compadd -- ${values:#} ;;
        3) compset -P '--*='; _files ;;
    esac
}
(( $+functions[compdef] )) && compdef _queuectl queuectl
""",
    "fish": r"""# queuectl completion for fish: queuectl completion fish > ~/.config/fish/completions/queuectl.fish
function __queuectl_complete
    set -l words (commandline -opc)  # unescaped; the current token comes as typed: unescaped here
    set -l current (commandline -ct)
    set -l word (string unescape -- "$current")
    set -l out (command $words[1] __complete fish $words[2..-1] "$word" 2>/dev/null)
    switch $status
        case 0
            printf '%s\n' $out
        case 3  # after --db= too
            set -l option (string match -r -- '^--[^=]*=' "$current")
            for path in (__fish_complete_path (string replace -r -- '^--[^=]*=' '' "$current"))
                echo "$option$path"
            end
    end
end
complete -c queuectl -f -a '(__queuectl_complete)'
""",
}


def cmd_completion(args, store: None) -> None:
    sys.stdout.write(COMPLETION_SCRIPTS[args.shell])


def complete_main(argv: list[str]) -> int:
    """`queuectl __complete SHELL WORD... CURRENT` (bash: SHELL LINE WORD, see _bash_words): the values for
    the word under the cursor, one a line; COMPLETE_FILES for file names. Silent on any failure, with
    nothing on stderr: whatever it printed would land in the user's prompt."""
    try:
        _give_up_after(COMPLETE_DEADLINE_S)
        shell, *rest = argv
        words, cut, quote = _bash_words(*rest) if shell == "bash" else (rest, 0, "")
        values = Completion().values(words)
        if values is None:
            return COMPLETE_FILES
        shown = [v[cut:] for v in values if _printable_value(v)]
        sys.stdout.write("".join(f"{_bash_quoted(v, quote) if shell == 'bash' else v}\n" for v in shown))
        sys.stdout.flush()
        return EXIT_OK
    except BaseException:  # noqa: BLE001 - a completion never shows a traceback, even on Ctrl+C
        return EXIT_FAIL
    finally:
        _give_up_after(0)


def _give_up_after(seconds: float) -> None:
    """End this process silently (EXIT_FAIL) once `seconds` have passed; 0 cancels. A PostgreSQL server that
    stops answering after the connection is made (its processes stopped, packets dropped while the peer's
    kernel still acknowledges) would otherwise hold the user's prompt: libpq's timeouts bound only the
    connecting and unacknowledged data."""
    import signal
    signal.signal(signal.SIGALRM, (lambda *_: os._exit(EXIT_FAIL)) if seconds else signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _bash_words(line: str, word: str) -> tuple[list[str], int, str]:
    """bash's line up to the cursor as the words after the program (and any NAME=VALUE before it), the last
    one the word under the cursor (maybe empty, maybe in an open quote); how much of that word precedes
    readline's `word`, which starts after the last COMP_WORDBREAKS character: bash replaces only `word`, so
    values must drop what precedes it; and the quote left open (' or ", else ""), in which a value goes.
    ValueError: a line shlex cannot read."""
    import shlex
    mark = "\x1f"  # ends the line, so a line ending in a blank ends with an empty word
    for closing in ("", '"', "'"):  # an open quote closed; the last try's error is the caller's
        with contextlib.suppress(ValueError):
            words = shlex.split(line + mark + closing)
            break
    else:
        words = shlex.split(line + mark)
    while len(words) > 1 and re.match(r"[A-Za-z_]\w*=", words[0]):
        del words[0]
    current = words[-1].removesuffix(mark)
    return words[1:-1] + [current], len(current) - len(word) if current.endswith(word) else 0, closing


def _bash_quoted(value: str, quote: str = "") -> str:
    """A value as bash must insert it. In an open single quote: as it is, each ' closed, escaped and reopened;
    in an open double quote: a backslash before each backslash, double quote, $ and backquote, and each ! (history
    expansion) outside the quotes; else a backslash before each character special to the shell. Readline closes
    the quote after a sole match."""
    if quote == "'":
        return value.replace("'", "'\\''")
    if quote == '"':
        return re.sub(r'([\\"$`])', r"\\\1", value).replace("!", '"\\!"')
    return re.sub(r"([^\w@%+=:,./-])", r"\\\1", value)


def _printable_value(value: str) -> bool:
    """False for a value written behind queuectl's back that would break a shell's line (see UNSAFE_TEXT)."""
    return bool(value) and not UNSAFE_TEXT.search(value)


class Completion:
    """The words typed after `queuectl`, read as build_parser() would: the parser of the command named so
    far, the positional words given to it, the option whose value comes next, and --db."""

    def __init__(self):
        self.top = self.parser = build_parser()
        self.path: list[str] = []  # the command and action names typed, e.g. ["dlq", "retry"]
        self.given: list[str] = []  # positional words given to self.parser
        self.expects: argparse.Action | None = None  # the option whose value the next word is
        self.after_dashes = False  # after `--` every word is positional
        self.db: str | None = None

    def values(self, words: list[str]) -> list[str] | None:
        """What may follow the words before the last one and start with the last one; None: file names."""
        *typed, current = words or [""]
        for word in typed:
            self._read(word)
        if self.expects:
            return self._own_words(self._values_of(self.expects, current))
        if current.startswith("-") and not self.after_dashes:
            return self._option_values(current)
        sub = _subcommands(self.parser)
        if sub is not None:
            return [name for name in sub.choices if name.startswith(current)]
        action = self._positional()
        if action is None:
            return self._options(current)
        return self._own_words(self._values_of(action, current))

    def _own_words(self, values: list[str] | None) -> list[str] | None:
        """The values that can be a word of their own here: before `--`, argparse takes one that starts with
        '-' (an id may) for an option; it is offered after `--`, or as --opt=VALUE."""
        if values is None or self.after_dashes:
            return values
        return [value for value in values if not value.startswith("-")]

    def _read(self, word: str) -> None:
        if self.expects:
            self._given(self.expects, word)
            self.expects = None
        elif word == "--" and not self.after_dashes:
            self.after_dashes = True
        elif word.startswith("-") and word != "-" and not self.after_dashes:
            name, equals, value = word.partition("=")
            action = self.parser._option_string_actions.get(name if word.startswith("--") else word)
            if action is not None and action.nargs != 0 and equals:
                self._given(action, value)
            elif action is not None and action.nargs != 0:
                self.expects = action
        else:
            sub = _subcommands(self.parser)
            if sub is not None and word in sub.choices:
                self.parser, self.given = _real_parser(sub.choices[word]), []
                self.path.append(word)
            else:
                self.given.append(word)

    def _given(self, action: argparse.Action, value: str) -> None:
        if action.dest == "db":
            self.db = value

    def _option_values(self, current: str) -> list[str] | None:
        """`--opt=VALUE...` completes the value; anything else, the option names."""
        name, equals, value = current.partition("=")
        action = self.parser._option_string_actions.get(name)
        if not equals or action is None or action.nargs == 0:
            return self._options(current)
        values = self._values_of(action, value)
        return None if values is None else [f"{name}={v}" for v in values]

    def _options(self, current: str) -> list[str]:
        return [option for action in self.parser._actions if action.help != argparse.SUPPRESS
                for option in action.option_strings if option.startswith(current)]

    def _positional(self) -> argparse.Action | None:
        """The positional argument that the next word gives."""
        left = len(self.given)
        for action in self.parser._actions:
            if action.option_strings:
                continue
            if action.nargs in (None, "?") and left:
                left -= 1
            else:
                return action
        return None

    def _values_of(self, action: argparse.Action, current: str) -> list[str] | None:
        """The values `action` takes that start with `current`; None: file names."""
        if action.choices is not None:
            return [str(c) for c in action.choices if str(c).startswith(current)]
        if action.dest in ("db", "cwd", "words"):
            return None
        if action.metavar == "ID":
            return self._ids(current)
        if action.dest == "queue":
            values = self._from_store(lambda store: store.complete_queues())
        elif action.dest == "topic":
            values = self._topics()
        else:
            values = {"state": STATES, "key": [k.replace("_", "-") for k in CONFIG]}.get(action.dest, [])
        return [value for value in values if value.startswith(current)]

    def _ids(self, prefix: str) -> list[str]:
        """Job ids (only dead ones for `dlq retry`), or schedule ids under `schedule`."""
        if self.path[:1] == ["schedule"]:
            return self._from_store(lambda store: store.complete_schedules(prefix))
        dead = self.path == ["dlq", "retry"]
        return self._from_store(lambda store: store.complete_ids(prefix, dead=dead))

    def _topics(self) -> list[str]:
        """`help COMMAND [ACTION]`: a command, then that command's actions."""
        commands = _subcommands(self.top).choices
        if not self.given:
            return list(commands)
        sub = _subcommands(_real_parser(commands[self.given[0]])) if self.given[0] in commands else None
        return list(sub.choices) if sub is not None and len(self.given) == 1 else []

    def _from_store(self, read: Callable[[Store], list[str]]) -> list[str]:
        """read(store) on the database of --db, $QUEUECTL_DB or ./queuectl.db, peeked at (see SqliteStore):
        nothing written, not even an upgrade, and no wait on a busy one; a missing one has no values."""
        target = os.path.expanduser(self.db if self.db is not None else os.environ.get("QUEUECTL_DB", "queuectl.db"))
        if not target or target == ":memory:" or target.startswith("file:"):
            return []
        try:
            store = open_database(target, peek=True, busy_deadline_s=COMPLETE_BUSY_S)
        except NoQueue:
            return []
        try:
            return read(store)
        finally:
            store.close()


def _subcommands(parser: argparse.ArgumentParser) -> argparse.Action | None:
    """The parser's subcommands action (its choices: name -> parser), if it has one."""
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _real_parser(parser) -> argparse.ArgumentParser:
    """A subcommand's parser with its arguments: a _LazyParser built (see _LazyParser)."""
    if isinstance(parser, _LazyParser):
        real = Parser(**parser._kwargs)
        parser.replay(real)
        return real
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, run one command, map errors to `queuectl: error: …` and an exit code."""
    _closed_streams_to_devnull()
    for stream in (sys.stdout, sys.stderr):  # a job's text must not crash a non-UTF-8 terminal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if not isinstance(sys.stdout, Stdout):
        sys.stdout = Stdout(sys.stdout)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [COMPLETE_COMMAND]:  # a shell asks for completions: nothing else of a command's start-up
        return complete_main(argv[1:])
    if not argv:  # as git does: what there is and how to start, on stdout; 1, since no command ran
        sys.stdout.write(overview())
        return _flushed(EXIT_FAIL)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version: a failure to print them is an error, not a silent exit 0
        return _flushed(e.code if isinstance(e.code, int) else EXIT_OK)
    except QueueError as e:
        return _fail(e)
    if args.command == "help":
        return main([*args.topic, "--help"])
    if args.command in ("worker", "dashboard"):
        configure_logging(args)
    return _dispatch(args)


def overview() -> str:
    """What a bare `queuectl` prints: the usage line, the commands and an example (the help's own)."""
    return build_parser().format_usage() + "\n" + __doc__[__doc__.index("commands:"):]


def _closed_streams_to_devnull() -> None:
    """Started with stdin, stdout or stderr closed (`<&-`, `>&-`, a daemon), Python has None for that
    stream: it is read from or written to /dev/null instead, as the closing asked, not a traceback (the
    open takes the lowest free descriptor, the closed one, so the jobs a worker starts get it too;
    hence stdin first, for descriptor 0)."""
    if sys.stdin is None:
        sys.stdin = open(os.devnull)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")


class Stdout:
    """sys.stdout for a command: a write or flush that fails (a full disk, an I/O error) raises
    OutputLost, not an OSError that would read like the database's failure. A reader that left
    (BrokenPipeError: `queuectl list | head`) is let through: that is no error."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def write_bytes(self, data: bytes) -> None:
        """Bytes as they are (a job's output), through the stream's byte layer, guarded the same way."""
        self._guarded(self.stream.buffer.write, data)

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputLost(f"cannot write to standard output: {_errno_text(e.errno) if e.errno else e}") from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _flushed(code: int) -> int:
    """`code`, once what --help or --version printed is written; else the error, exit 1."""
    try:
        sys.stdout.flush()
    except OutputLost as e:
        return _fail(e)
    return code


def typed_ids(args) -> list[str]:
    """The job or schedule ids given on the command line."""
    if getattr(args, "id", None) is not None:
        return [args.id]
    return getattr(args, "ids", None) or []


def command_name(args) -> str:
    """The command as typed, for messages: `status`, `dlq retry`."""
    return " ".join(filter(None, (args.command, getattr(args, "action", None))))


def _dispatch(args) -> int:
    """Open the database, run the command, turn every failure a user can cause into one line."""
    store = None
    try:
        if args.json and not args.json_flag:
            raise UsageError(f"{command_name(args)} has no --json")
        if args.check:  # invalid input is refused before the database is opened (or created)
            args.check(args)
        checked_ids(typed_ids(args))  # a bad id too, so a read of a missing queue adds no note to the error
        if args.opens_store:  # a check may find the command needs no database (`schedule next --cron`)
            store = open_store(args)
            store.committed = False  # what opening wrote (a new file's schema) is not the command's change
        code = args.func(args, store) or EXIT_OK
        sys.stdout.flush()  # here, not at exit: an output that cannot be written must say what was saved
        return code
    except OutputLost as e:
        saved = store is not None and store.committed
        return _fail(OutputLost(f"{e}; the command's changes were saved") if saved else e)
    except QueueError as e:
        return _fail(e)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except sqlite3.DatabaseError as e:  # one the Store met after opening (those at opening are BadDatabase)
        return _fail(database_error(store.path, e, opening=False, write=not store.read_only))
    except BrokenPipeError:  # `queuectl list | head`: the reader left; not an error worth a line
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return EXIT_OK
    except OSError as e:
        return _fail(QueueError(f"{e.strerror or e}: {e.filename or ''}".rstrip(": ")))
    finally:
        if store is not None:
            store.close()


def configure_logging(args) -> None:
    """Worker log lines on stderr, one per job event: text, or with `--log-format json` JSON Lines;
    `--quiet` leaves out each job's routine lines (claimed, completed)."""
    import logging
    log.quiet = getattr(args, "quiet", False)
    handler = logging.StreamHandler(sys.stderr)
    as_json = getattr(args, "log_format", "text") == "json"
    handler.setFormatter(JsonLines() if as_json else TextLines(logging.Formatter()))
    logging.basicConfig(handlers=[handler], level=logging.INFO)
    # Past logging only where it would write the line through this handler alone: not where logging was
    # set up before (a program calling main(), pytest), whose handlers must see every record.
    alone = not as_json and logging.getLogger().handlers == [handler]
    log.lines = RoutineLines(handler) if alone else None


class TextLines:
    """The text log formatter: `2026-12-01T18:05:08.216Z queuectl[PID]: message`, the message through
    printable() (job ids, commands and errors are job data; this is the one place every line passes), a
    logged exception's traceback below it, each of its lines escaped but kept a line."""

    def __init__(self, plain):
        self.plain = plain  # a logging.Formatter: its traceback text

    def format(self, record) -> str:
        line = self.line(record.created, record.process, record.getMessage())
        if record.exc_info:
            trace = self.plain.formatException(record.exc_info)
            line += "\n" + "\n".join(printable(part) for part in trace.split("\n"))
        return line

    second_stamp: tuple = (None, "")  # the last line's whole second and its text (see stamp_of)

    @staticmethod
    def line(created: float, pid: int, message: str) -> str:
        return f"{TextLines.stamp_of(created)} queuectl[{pid}]: {printable(message)}"

    @staticmethod
    def stamp_of(created: float) -> str:
        """iso(created), its date and time formatted once a second: a worker writes two lines a job, and
        datetime's formatting was a share of a short job's CPU (DECISIONS.md). Rounded as datetime does."""
        second = math.floor(created)
        micro = round((created - second) * 1e6)
        if micro >= 1_000_000:
            second, micro = second + 1, micro - 1_000_000
        cached = TextLines.second_stamp  # one attribute, so threads never see a second with another's text
        if cached[0] != second:
            cached = TextLines.second_stamp = (second, iso(second)[:-5])  # without ".000Z"
        return f"{cached[1]}.{micro // 1000:03d}Z"


class RoutineLines:
    """Writes a job's routine lines (see _Log.routine) as `handler`, whose formatter is TextLines, would:
    TextLines.line, then the handler's own write and flush under its lock, so lines never interleave.
    A write that fails goes to the handler's handleError, as a record's would."""

    def __init__(self, handler):
        import logging
        self.handler, self.only = handler, [handler]
        self.logger, self.level = logging.getLogger("queuectl"), logging.INFO

    def alone(self) -> bool:
        """Whether logging would write a line at INFO through the handler and no other. Asked at each line: a
        program or a test may set logging up after the worker started (a handler, a level)."""
        logger = self.logger
        return (logger.root.handlers == self.only and not logger.handlers and not logger.filters
                and logger.propagate and logger.isEnabledFor(self.level))

    def write(self, message: str) -> None:
        line = TextLines.line(time.time(), os.getpid(), message) + "\n"
        try:
            with self.handler.lock:  # the handler's flush, inlined: it would take the same lock again
                stream = self.handler.stream
                stream.write(line)
                stream.flush()
        except Exception:  # noqa: BLE001 - as logging does: the line stays in the stream's buffer, not written again
            import logging
            self.handler.handleError(logging.makeLogRecord({"name": self.logger.name, "msg": message,
                                                            "levelno": self.level, "levelname": "INFO"}))


class JsonLines:
    """A logging formatter (duck-typed: logging is imported only by workers) that writes one JSON
    object a line: ts, level, event, message, pid, then the event's fields (job_id, attempt,
    exit_code, error, ...), and traceback for a logged exception. A line from a call that names
    no event (another library's) has the event "log"."""

    def format(self, record) -> str:
        line = {"ts": iso(record.created), "level": record.levelname.lower(),
                "event": getattr(record, "event", "log"), "message": record.getMessage(), "pid": record.process,
                **getattr(record, "fields", {})}
        if record.exc_info:
            import traceback
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json_text(line, default=str)


def _fail(error: QueueError) -> int:
    print(f"queuectl: error: {printable(str(error))}", file=sys.stderr)  # messages quote input
    return error.exit_code


def exit_now(code: int):
    """Exit with `code`. With no thread left that Python would wait for, skip the interpreter's teardown
    (os._exit): by now every commit is made and nothing of ours runs at exit; only the output is
    flushed. The teardown frees every object of this large module one by one and unloads psycopg, a
    share of a short command's time worth saving (figures in DECISIONS.md). Daemon
    threads do not count: a stopped worker leaves its signal watcher, and on PostgreSQL its listener
    (in libpq's wait for up to a second) and output flushers, and a teardown that races them can crash
    the interpreter (SIGSEGV in libpython after "worker exited (0)"). A thread that is no
    daemon (none of ours) gets the usual exit, which waits for it."""
    threads = sys.modules.get("threading")
    others = [] if threads is None else [t for t in threads.enumerate() if t is not threads.current_thread()]
    if any(not t.daemon for t in others):
        sys.exit(code)
    try:
        for stream in (sys.stdout, sys.stderr):  # never None: see _closed_streams_to_devnull
            with contextlib.suppress(BrokenPipeError):  # a reader that left changes nothing now
                stream.flush()
    except OutputLost as e:  # what main() left unwritten (it flushes a command's output itself)
        code = code or _fail(e)
    except (OSError, ValueError):  # stderr that could not be written (a full disk): the usual exit says so
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
