#!/usr/bin/env python3
"""queuectl benchmark: the performance figures and their targets, measured in one run.

Every queuectl command runs as users run it, `python3 queuectl.py --db TMP ...`, against databases
in a temporary folder that is removed afterwards; the draining workers run as users install the command
(a copied `queuectl` from its cached bytecode), since a compile on every start is no part of a drain.
Sections:

  drain    N `true` jobs drained by `worker start --burst --count 2` (its default log lines written),
           against a plain stdlib loop running the same N `sh -c true` from 2 threads with the same
           process settings: rates, and the worker's own CPU a job (its /proc utime+stime, less an
           idle worker's over the same wall time) against the loop's (getrusage); again with
           `true; true` (a command that needs the shell) on both sides; task-spooler's drain of the same
           jobs with 2 slots when `tsp` is installed
  enqueue  one job per process, against `python3 -c "import sqlite3, argparse, json"`
  startup  the same one-job enqueue as users install the command (a copied `./queuectl`, `make install`'s
           copy, `python3 -m queuectl`), from the second run on with bytecode writing on, against the same
           import; `python3 queuectl.py` beside
  batch    many jobs through `enqueue -` (JSON Lines on stdin)
  pickup   the wake-up: an `enqueue`'s commit (its id printed) -> the job's command starting, with an
           idle worker; from the enqueue returning beside it
  idle     CPU used by `worker start --count 4` with nothing to do (PostgreSQL: its server backends too)
  scale    drain, pickup and the read commands again with a million finished jobs in the table; shell
           completion's values from it (`__complete`, the installed copy, as a Tab runs it)
  backlog  idle cost, pickup and drain again beside work no worker may take: 300,000 pending jobs in
           a paused queue and 100,000 due tomorrow (a claim or poll must not walk past them)
  memory   peak RSS of `worker start --count 8 --burst` while draining, as installed (cached bytecode);
           `python3 queuectl.py`, which compiles the file at every start, beside it
  parallel 400 `sleep 0.05` jobs drained by one `worker start --burst --count 4` process, then by two
           at once: the second process must nearly double the rate (claims must not serialise)

PostgreSQL: with `--pg URL` (or $QUEUECTL_TEST_PG), a postgresql:// server (`?schema=` is ignored),
drain, enqueue, batch, pickup, idle and parallel are measured on it too, in the same run, each
beside its SQLite figure in a PostgreSQL column with targets of its own. Each PostgreSQL measurement
uses a fresh schema (bench_<section>_<pid>_<random>) that is dropped afterwards. The report's header
names the server's durability settings (fsync, synchronous_commit, full_page_writes): they change
every PostgreSQL figure. Without a server the column reads "no server" and those targets are not
judged; with one that cannot be used, its figures are not measured (so not met) and the exit code is 1.

Prints a Markdown table (or, with --json, only JSON on stdout); progress goes to stderr. A figure
that could not be measured here (a process gone before /proc was read, an empty sample, a tool this
machine lacks, a section that did not run) is shown as "not measured" with the reason, never as a
value, and its target as not met.
Exit code 0 when the benchmark ran, whatever the figures; with --check, 1 if a target was missed or
not measured.
`--tiny` runs a few jobs of each, under 30 s (about 20 s more with a PostgreSQL server, whose column
it measures too), so `make test` keeps this script working. Its
figures judge nothing (a few jobs on a test machine), so it prints no verdict at all, and checks
its own output for one: exit 1 if the benchmark code fails or a verdict slips into the report.
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import resource
import re
import select
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUECTL = os.path.join(ROOT, "queuectl.py")
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
SECTIONS = ("drain", "enqueue", "startup", "batch", "pickup", "idle", "scale", "backlog", "memory", "parallel")
PG_ENV = "QUEUECTL_TEST_PG"  # the PostgreSQL server to measure when --pg is not given
NO_SERVER = "no server"  # the PostgreSQL column without a server: shown, never judged

FULL = dict(jobs=2000, repeats=5, enqueue_runs=15, batch=100_000, pickup_jobs=20, idle_seconds=30.0,
            settle_seconds=1.0, scale_rows=1_000_000, scale_days=25, memory_jobs=500, query_runs=3, list_pending=100,
            backlog_paused=300_000, backlog_later=100_000, backlog_idle_seconds=10.0,
            parallel_jobs=400, parallel_repeats=3)
# tiny: backlog_idle_seconds is short because a worker start and stop already take seconds each
# time, and the tiny figures only keep this script working; idle_seconds is long enough that one
# clock tick stays under the idle target, so the figure is still measured.
TINY = dict(jobs=20, repeats=1, enqueue_runs=3, batch=1000, pickup_jobs=3, idle_seconds=4.0,
            settle_seconds=0.5, scale_rows=10_000, scale_days=25, memory_jobs=20, query_runs=1, list_pending=10,
            backlog_paused=3000, backlog_later=1000, backlog_idle_seconds=1.0,
            parallel_jobs=16, parallel_repeats=1)

# key -> (comparison, bound, text): the performance targets
TARGETS = {
    # The drain against the plain loop has no target: 1.0 x is out of reach while each result is a durable
    # transaction; cpu_ratio and tsp_ratio are what the queue controls (DECISIONS.md, Performance).
    "tsp_ratio": (">=", 1.25, "≥ 1.25"),
    "cpu_ratio": ("<=", 2.0, "≤ 2.0"),
    "startup_copy_ratio": ("<=", 1.25, "≤ 1.25"),
    "startup_install_ratio": ("<=", 1.25, "≤ 1.25"),
    "startup_module_ratio": ("<=", 1.25, "≤ 1.25"),
    "batch_rate": (">=", 50_000, "≥ 50,000 jobs/s"),
    # The wake-up: from the enqueue's commit (its id printed) to the job's command starting, idle worker
    "pickup_ack_p50": ("<=", 5, "≤ 5 ms"),
    "pickup_ack_p95": ("<=", 20, "≤ 20 ms"),
    "idle_pct": ("<=", 0.3, "≤ 0.3 %"),
    "scale_drain_ratio": (">=", 0.9, "≥ 0.9"),
    "scale_pickup_p50_ratio": (">=", 0.9, "≥ 0.9"),
    "scale_pickup_p95_ratio": (">=", 0.9, "≥ 0.9"),
    "scale_status": ("<=", 0.3, "< 0.3 s"),
    "scale_list": ("<=", 0.3, "< 0.3 s"),
    "scale_stats": ("<=", 0.3, "< 0.3 s"),
    "scale_stats_30d": ("<=", 3.0, "< 3 s"),
    # Shell completion: a Tab runs `queuectl __complete` (a whole process) before the prompt can go on
    "scale_complete_ids": ("<=", 100, "≤ 100 ms"),
    "scale_complete_dead": ("<=", 100, "≤ 100 ms"),
    "scale_complete_queues": ("<=", 100, "≤ 100 ms"),
    "backlog_idle_pct": ("<=", 1.0, "≤ 1 %"),
    "backlog_drain_ratio": (">=", 0.9, "≥ 0.9"),
    "backlog_pickup_p50_ratio": (">=", 0.9, "≥ 0.9"),
    "backlog_pickup_p95_ratio": (">=", 0.9, "≥ 0.9"),
    "memory_rss": ("<=", 40, "≤ 40 MB"),
    # PostgreSQL (the --pg server), measured in the same run as the SQLite figures
    "pg_drain_ratio": (">=", 0.8, "≥ 0.8 × SQLite"),
    "pg_enqueue_ratio": ("<=", 1.2, "≤ 1.2"),
    "pg_batch_rate": (">=", 50_000, "≥ 50,000 jobs/s"),
    "pg_pickup_p50": ("<=", 5, "≤ 5 ms"),
    "pg_pickup_p95": ("<=", 20, "≤ 20 ms"),
    "pg_idle_pct": ("<=", 0.3, "≤ 0.3 %"),
    "pg_parallel_ratio": (">=", 1.8, "≥ 1.8"),
}

# Figures that are measured correctly at zero or below: a job can start before the `enqueue` that
# added it has exited (negative latency from enqueue exit), and an idle worker can use no clock tick.
# Every other figure (a rate, a duration, a ratio, a memory size) of zero or below means its
# measurement failed, and is shown as not measured.
MAY_BE_ZERO = {"pickup_p50", "pickup_p95", "scale_pickup_p50", "scale_pickup_p95", "backlog_pickup_p50",
               "backlog_pickup_p95", "idle_pct", "backlog_idle_pct", "pg_pickup_p50", "pg_pickup_p95", "pg_idle_pct",
               "pickup_ack_p50", "pickup_ack_p95", "pg_pickup_exit_p50", "pg_pickup_exit_p95"}

NOT_MEASURED = "not measured"
NO_VERDICT = "(tiny: no verdict)"
# A verdict cell of the table, as render() writes it: what the tiny mode checks its report for.
VERDICT_CELL = re.compile(r"\|\s*(pass|\*\*FAIL\*\*|FAIL|fail)\s*\|")

UNITS = {"jobs/s": "{:,.0f} jobs/s", "ms": "{:.1f} ms", "s": "{:.3f} s", "x": "{:.2f}", "%": "{:.2f} %",
         "MB": "{:.1f} MB"}


class BenchError(Exception):
    """Something the benchmark needed did not work (a command failed, a wait timed out)."""


def measured(key: str, value) -> bool:
    """Is value a figure that was really measured? None, NaN or infinity never is; zero or below is only
    for the figures in MAY_BE_ZERO (for the others it is what a failed reading leaves, e.g. a peak RSS
    read as 0.0 MB from a process whose memory was already gone)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 or key in MAY_BE_ZERO


def verdict(key: str, value, why: str = "") -> str | None:
    """The judgement of one figure against its target: None if it has no target, NOT_MEASURED if it
    could not be measured (`why` says why, or the value is not a measurement), else "pass" or "fail".
    A figure that was not measured is never a pass."""
    if key not in TARGETS:
        return None
    if why or not measured(key, value):
        return NOT_MEASURED
    op, bound, _ = TARGETS[key]
    return "pass" if (value >= bound if op == ">=" else value <= bound) else "fail"


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None if either was not measured (None) or den is not above zero."""
    if num is None or den is None or not den > 0:
        return None
    return num / den


T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ==== Processes ==================================================================================

def proc_sample(pid: int) -> dict | None:
    """CPU (seconds, own and reaped children) and memory (MB) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    # A process that is exiting has released its memory before it becomes a zombie: its status then
    # has no Vm* lines, and its memory is unknown (None), not 0 MB.
    mb = lambda key: int(status[key].split()[0]) / 1024 if key in status else None  # noqa: E731
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / CLK_TCK,
            "children_cpu_s": (int(fields[13]) + int(fields[14])) / CLK_TCK,
            "hwm_mb": mb("VmHWM"), "rss_mb": mb("VmRSS"), "threads": int(fields[17])}


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of a list; None for an empty one (nothing was measured)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


def first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:160]


def pg_urls(url: str, schema: str | None = None) -> tuple[str, str]:
    """(the URL for libpq, without `schema`; the URL for queuectl's --db with ?schema=schema)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    libpq = urlunsplit(parts._replace(query=urlencode(query)))
    return libpq, urlunsplit(parts._replace(query=urlencode(query + [("schema", schema or "")])))


def pg_display(url: str) -> str:
    """The server's URL as the report shows it: user@host:port/db, never a secret."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.username or ''}@{parts.hostname or ''}:{parts.port or 5432}{parts.path}"


class Bench:
    """One benchmark run: a temporary folder, the processes it started, and the results."""

    def __init__(self, params: dict, tmp: str, verdicts: bool = True):
        self.p = params
        self.verdicts = verdicts  # False in the tiny mode: figures are shown, never judged
        self.sections: tuple[str, ...] = SECTIONS  # the sections this run measures (--only)
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.results: list[dict] = []
        self.raw: dict = {}
        self.notes: list[str] = []
        self.rng = random.Random(params["seed"])
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUECTL_")}
        self.batch_ok = False
        self.clock_why = ""  # why the pickup latencies cannot be measured here ("" if they can)
        # PostgreSQL (use_pg sets these): the server's URL ("" for none); why its figures cannot be
        # measured ("" if they can; NO_SERVER without a server, and then they are not judged); the
        # schemas this run made and has not dropped yet; what went wrong measuring it.
        self.pg_url = ""
        self.pg_why = NO_SERVER
        self.pg_info = NO_SERVER
        self.pg_local = False  # the server runs on this machine: its backends' CPU can be read in /proc
        self.pg_schemas: set[str] = set()
        self.pg_errors: list[str] = []

    # -- running queuectl ------------------------------------------------------------------------

    def argv(self, db: str, *args: str) -> list[str]:
        return [PY, QUEUECTL, "--db", db, *args]

    def qc(self, db: str, *args: str, stdin: str | None = None, check: bool = True,
           timeout: float = 600) -> subprocess.CompletedProcess:
        """Run one queuectl command to completion, as a user would."""
        r = subprocess.run(self.argv(db, *args), input=stdin, capture_output=True, text=True, cwd=self.tmp,
                           env=self.env, timeout=timeout, stdin=None if stdin is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise BenchError(f"`queuectl {shlex.join(args)}` exited {r.returncode}: {r.stderr.strip()[-600:]}")
        return r

    def timed(self, argv: list[str], stdin: str | None = None,
              env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
        t = time.perf_counter()
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=self.tmp, env=env or self.env,
                           stdin=None if stdin is not None else subprocess.DEVNULL, timeout=600)
        return time.perf_counter() - t, r

    def new_db(self, name: str) -> str:
        """A fresh database, created by queuectl itself (so creation is not part of any timing)."""
        db = os.path.join(self.tmp, name + ".db")
        self.qc(db, "config", "set", "max-retries", "3")  # a command that writes: one that reads creates nothing
        return db

    def counts(self, db: str) -> dict:
        return json.loads(self.qc(db, "status", "--json").stdout)["jobs"]

    def installed(self) -> tuple[str, dict]:
        """A copied `queuectl` as users install it, run from its cached bytecode (see launcher_env),
        and its environment; the first call copies it and fills the cache (not timed)."""
        copy = os.path.join(self.tmp, "queuectl-installed")
        if not os.path.exists(copy):
            shutil.copyfile(QUEUECTL, copy)
            os.chmod(copy, 0o755)
            subprocess.run([copy, "--version"], env=launcher_env(self), capture_output=True, timeout=60, check=True)
        return copy, launcher_env(self)

    def spawn(self, db: str, *args: str, log: str, installed: bool = False) -> subprocess.Popen:
        """Start a long-running queuectl command (a worker) with its output in a log file; `installed`:
        as a copied `queuectl` from its cached bytecode, else `python3 queuectl.py`."""
        argv, env = self.argv(db, *args), self.env
        if installed:
            copy, env = self.installed()
            argv = [copy, *argv[2:]]
        with open(os.path.join(self.tmp, log), "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, cwd=self.tmp, env=env)
        self.procs.append(p)
        return p

    @staticmethod
    def poll_exit(p: subprocess.Popen):
        """Reap p if it exited (os.wait4, so we get its resource usage); returns the rusage or None."""
        if p.returncode is not None:
            return getattr(p, "rusage", None)
        try:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:
            p.returncode = -1
            return None
        if pid == 0:
            return None
        p.returncode = os.waitstatus_to_exitcode(status)
        p.rusage = usage
        return usage

    def reap(self, p: subprocess.Popen, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while p.returncode is None and time.monotonic() < deadline:
            self.poll_exit(p)
            time.sleep(0.01)
        return p.returncode is not None

    def kill(self, p: subprocess.Popen) -> None:
        """SIGTERM (a graceful stop), then SIGKILL: only processes this run started, by pid."""
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            self.poll_exit(p)
            if p.returncode is not None:
                return
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
            self.reap(p, wait_s)

    def cleanup(self) -> None:
        for p in self.procs:
            self.kill(p)
        for schema in sorted(self.pg_schemas):  # left by a measurement that was interrupted
            self.pg_drop(schema)

    # -- PostgreSQL ----------------------------------------------------------------------------------

    def use_pg(self, url: str) -> None:
        """Measure the PostgreSQL column on the server at url, if it answers and queuectl can use it."""
        self.pg_url, self.pg_why = url, ""
        try:
            import psycopg  # noqa: F401  (only the PostgreSQL column needs it)
        except ImportError:
            return self.pg_fail("psycopg is not installed (pip install 'psycopg[binary]')")
        try:
            with self.pg_connect() as conn:
                version, fsync, sync, fpw, addr = conn.execute(
                    "SELECT current_setting('server_version'), current_setting('fsync'), "
                    "current_setting('synchronous_commit'), current_setting('full_page_writes'), "
                    "coalesce(host(inet_server_addr()), 'local socket')").fetchone()
        except Exception as e:  # psycopg.Error, or a URL libpq cannot parse
            return self.pg_fail(f"cannot connect to the server: {first_line(e)}")
        self.pg_local = addr in ("local socket", "127.0.0.1", "::1")
        self.pg_info = (f"{version.split()[0]} at {pg_display(url)} ({'this machine' if self.pg_local else addr}); "
                        f"fsync={fsync}, synchronous_commit={sync}, full_page_writes={fpw}")
        try:
            with self.fresh("probe", pg=True):  # can queuectl itself make and use a schema there?
                pass
        except BenchError as e:
            return self.pg_fail(f"queuectl cannot use the server: {first_line(e)}")

    def pg_fail(self, why: str) -> None:
        """The server given cannot be measured: every PostgreSQL figure is then not measured (so not
        met), and the run's exit code is 1."""
        self.pg_why = why
        self.pg_errors.append(why)
        say(f"PostgreSQL: {why}")

    def pg_connect(self):
        import psycopg
        libpq, _ = pg_urls(self.pg_url)
        return psycopg.connect(libpq, autocommit=True, connect_timeout=30)

    def pg_drop(self, schema: str) -> None:
        """Drop a schema this run made, with everything in it (its workers have exited by now)."""
        try:
            with self.pg_connect() as conn:
                conn.execute("SET lock_timeout = '30s'")  # a leftover session holding a lock fails loudly
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # a name made by fresh()
            self.pg_schemas.discard(schema)
        except Exception as e:
            self.pg_errors.append(f"could not drop schema {schema}: {first_line(e)}")
            say(f"PostgreSQL: could not drop schema {schema}: {first_line(e)}")

    @contextlib.contextmanager
    def fresh(self, tag: str, pg: bool = False):
        """A fresh database for one measurement, created by queuectl itself (so creation is not part of
        any timing): a SQLite file, or with pg a new schema on the server, dropped afterwards."""
        if not pg:
            yield self.new_db(tag)
            return
        schema = f"bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        if not re.fullmatch(r"[a-z0-9_]{1,63}", schema):
            raise BenchError(f"not a schema name for the benchmark: {schema!r}")
        _, url = pg_urls(self.pg_url, schema)
        self.pg_schemas.add(schema)
        try:
            self.qc(url, "config", "set", "max-retries", "3")  # creates the schema (a command that reads would not)
            yield url
        finally:
            self.pg_drop(schema)

    def pg_measure(self, rows: list[tuple[str, str, str]], measure) -> None:
        """Run measure(), which records the PostgreSQL figures `rows` ((key, label, unit) each) with
        add(..., pg=True). Without a usable server each row is recorded unmeasured (pg_why); if the
        measurement fails, the rows it had not recorded yet are, and the run's exit code becomes 1 while
        the SQLite figures go on being measured."""
        if not self.pg_why:
            try:
                measure()
            except BenchError as e:
                self.pg_errors.append(str(e))
                say(f"PostgreSQL: error: {e}")
                done = {r["key"] for r in self.results}
                for key, label, unit in rows:
                    if key not in done:
                        self.add(key, label, None, unit, why=f"the measurement failed: {first_line(e)}", pg=True)
            return
        for key, label, unit in rows:
            self.add(key, label, None, unit, pg=True)

    def pg_backend_cpu(self) -> dict[int, float] | None:
        """CPU seconds of each client backend of the server's database (but this query's own), from
        /proc: None if the server is not on this machine or /proc cannot be read."""
        if not self.pg_local:
            return None
        try:
            with self.pg_connect() as conn:
                pids = [r[0] for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")]
        except Exception:
            return None
        cpu = {pid: s["cpu_s"] for pid in pids if (s := proc_sample(pid))}
        return cpu if len(cpu) == len(pids) else None

    def log_tail(self, log: str, lines: int = 15) -> str:
        try:
            with open(os.path.join(self.tmp, log), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def wait_log(self, p: subprocess.Popen, log: str, text: str, timeout_s: float = 20.0) -> None:
        """Poll the worker's log until `text` appears; fail if it exits or the deadline passes."""
        path = os.path.join(self.tmp, log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return
            if self.poll_exit(p) is not None or p.returncode is not None:
                raise BenchError(f"worker exited ({p.returncode}) before logging {text!r}:\n{self.log_tail(log)}")
            time.sleep(0.02)
        raise BenchError(f"worker did not log {text!r} within {timeout_s:g}s:\n{self.log_tail(log)}")

    def run_to_exit(self, db: str, *args: str, log: str, timeout_s: float, installed: bool = False) -> dict:
        """Run a command that exits by itself (a burst worker), timing it and sampling /proc."""
        if installed:
            self.installed()  # copied and its bytecode cached before the clock starts
        t0 = time.perf_counter()
        p = self.spawn(db, *args, log=log, installed=installed)
        deadline, next_sample, last, peak_mb, samples = t0 + timeout_s, 0.0, None, None, 0
        while True:
            usage = self.poll_exit(p)
            now = time.perf_counter()
            if p.returncode is not None:
                break
            if now >= next_sample:
                sample = proc_sample(p.pid)
                if sample:
                    samples += 1
                    sample["max_threads"] = max(sample["threads"], (last or {}).get("max_threads", 0))
                    if sample["hwm_mb"] is not None:
                        peak_mb = max(sample["hwm_mb"], peak_mb or 0.0)
                    last = sample
                next_sample = now + 0.02
            if now > deadline:
                self.kill(p)
                raise BenchError(f"`queuectl {shlex.join(args)}` still running after {timeout_s:g}s:\n"
                                 f"{self.log_tail(log)}")
            time.sleep(0.005)
        wall = now - t0
        if p.returncode != 0:
            raise BenchError(f"`queuectl {shlex.join(args)}` exited {p.returncode}:\n{self.log_tail(log)}")
        total_cpu = (usage.ru_utime + usage.ru_stime) if usage else None
        # peak_mb: the highest VmHWM read (None if no sample had one); samples: /proc reads that worked.
        return {"wall_s": wall, "last": last or {}, "total_cpu_s": total_cpu, "peak_mb": peak_mb,
                "samples": samples}

    def stop_worker(self, db: str, p: subprocess.Popen, log: str) -> None:
        """`worker stop --wait`, then make sure the process is gone."""
        r = self.qc(db, "worker", "stop", "--wait", "--timeout", "30", check=False, timeout=60)
        if not self.reap(p, 15):
            self.kill(p)
            raise BenchError(f"worker did not exit after `worker stop --wait` ({r.stderr.strip()}):\n"
                             f"{self.log_tail(log)}")
        if r.returncode != 0 or p.returncode != 0:
            raise BenchError(f"worker stop exited {r.returncode}, worker {p.returncode}: {r.stderr.strip()}\n"
                             f"{self.log_tail(log)}")

    # -- enqueueing --------------------------------------------------------------------------------

    def probe_batch(self) -> None:
        """Does this queuectl have `enqueue -` (JSON Lines on stdin, one id a line)?"""
        db = os.path.join(self.tmp, "probe.db")
        r = self.qc(db, "enqueue", "-", stdin='{"command": "true", "id": "p1"}\n{"command": "true", "id": "p2"}\n',
                    check=False)
        self.batch_ok = r.returncode == 0 and r.stdout.split() == ["p1", "p2"]
        if not self.batch_ok:
            self.notes.append("`enqueue -` is not available in this queuectl: jobs were enqueued by a loop of "
                              "`enqueue JSON` processes (slow), and the batch figure is not measured")
            say("note: `enqueue -` not available; falling back to one process per job")

    def probe_clock(self) -> None:
        """The pickup jobs record their start with `date +%s%N` (exec'd by the job's shell, no Python
        start-up); a `date` without nanoseconds (%N) cannot time them, and the latencies are then
        not measured rather than misread."""
        try:
            out = subprocess.run(["/bin/sh", "-c", "date +%s%N"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            out = f"({e})"
        if not (out.isdigit() and abs(int(out) - time.time_ns()) < 60e9):
            self.clock_why = f"`date +%s%N` gives no time in nanoseconds here ({out[:40]!r})"
            say(f"note: {self.clock_why}; pickup latencies will not be measured")

    def enqueue_many(self, db: str, jobs: list[dict]) -> None:
        """Enqueue jobs the fastest way this queuectl offers."""
        if self.batch_ok:
            r = self.qc(db, "enqueue", "-", stdin="".join(json.dumps(j) + "\n" for j in jobs))
            if len(r.stdout.splitlines()) != len(jobs):
                raise BenchError(f"enqueue - printed {len(r.stdout.splitlines())} ids for {len(jobs)} jobs")
            return
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda j: self.qc(db, "enqueue", json.dumps(j)), jobs))

    # -- results -----------------------------------------------------------------------------------

    def add(self, key: str, label: str, value: float | None, unit: str, detail: str = "", why: str = "",
            pg: bool = False) -> None:
        """Record one figure, judged against its target if it has one (and this run gives verdicts).
        `why` says why the figure could not be measured; a value that is not a measurement (None, or
        zero where only a failed reading gives zero) is recorded as not measured too, never as a value.
        With pg, a figure of the PostgreSQL column (in the row of the SQLite figure with the same label):
        without a server it reads NO_SERVER and is not judged."""
        if pg and self.pg_why and not why:
            why = self.pg_why
        if not why and not measured(key, value):
            why = "no value was read" if value is None else f"read {value!r}, which no working measurement gives"
        if why:
            value = None
        target = TARGETS[key][2] if key in TARGETS else ""
        judged = verdict(key, value, why) if self.verdicts and why != NO_SERVER else None
        self.results.append({"key": key, "backend": "postgresql" if pg else "sqlite", "label": label,
                             "value": value, "unit": unit, "target": target,
                             "verdict": judged, "pass": None if judged in (None, NOT_MEASURED) else judged == "pass",
                             "why": why, "detail": detail})
        shown = f"{NOT_MEASURED} ({why})" if why else UNITS[unit].format(value)
        say(f"  {'PostgreSQL: ' if pg else ''}{label}: {shown} {target} "
            f"{'FAIL' if judged == 'fail' else judged or ''}".rstrip())


# ==== Measurements =================================================================================

def drain_once(b: Bench, db: str, n: int, tag: str, command: str = "true") -> dict:
    """Enqueue n jobs of `command`, time a burst worker with 2 threads draining them, check they completed.
    The worker writes its default log lines (claimed, completed: to a file), as users run it; --quiet
    would leave out a cost every default worker pays. It runs as users install it (a copied `queuectl`
    from its cached bytecode): `python3 queuectl.py` would add the compilation of the whole file to
    every drain's clock."""
    before = b.counts(db)
    b.enqueue_many(db, [{"command": command}] * n)
    run = b.run_to_exit(db, "worker", "start", "--burst", "--count", "2", log=f"drain-{tag}.log",
                        timeout_s=120 + n / 20, installed=True)
    after = b.counts(db)
    left = {s: after[s] for s in ("pending", "processing", "failed", "dead") if after[s] != before[s]}
    if after["completed"] - before["completed"] != n or left:
        raise BenchError(f"drain {tag}: {after['completed'] - before['completed']} of {n} completed; {left}")
    return {"rate": n / run["wall_s"], "wall_s": run["wall_s"], "self_cpu_s": run["last"].get("cpu_s"),
            "total_cpu_s": run["total_cpu_s"]}


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z ")


def log_span(path: str) -> tuple[float | None, float | None]:
    """Wall times of the first `claimed` and the last `completed` line of a worker log, if its lines
    start with their UTC time; (None, None) otherwise (the breakdown is then left out)."""
    import calendar
    first = last = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = LOG_TIME.match(line)
                if not m:
                    continue
                t = calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S")) + int(m[2]) / 1000
                if first is None and " claimed" in line:
                    first = t
                if " completed" in line:
                    last = t
    except (OSError, ValueError, OverflowError):
        return None, None
    return (first, last) if first is not None and last is not None else (None, None)


def plain_loop(n: int, threads: int = 2, command: str = "true", cpu: list | None = None) -> float:
    """The same n commands with the same process settings from a plain stdlib loop; jobs/s. `cpu`, if
    given, gets the CPU seconds this process spent on it (getrusage: the parent alone, its children
    are reaped into RUSAGE_CHILDREN)."""
    lock, todo = threading.Lock(), [n]

    def runner():
        while True:
            with lock:
                if todo[0] == 0:
                    return
                todo[0] -= 1
            p = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            p.stdout.read()
            p.stdout.close()
            p.wait()

    return n / with_cpu(cpu, lambda: run_threads(runner, threads))


def with_cpu(cpu: list | None, work):
    """work()'s result; the CPU seconds this process spent meanwhile (getrusage: every thread) appended to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = work()
    after = resource.getrusage(resource.RUSAGE_SELF)
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return result


def idle_worker_cpu(b: Bench, wall_s: float, tag: str) -> float:
    """CPU seconds of the drain's worker (`worker start --count 2`, installed) started on an empty queue and
    read after `wall_s`, its start-up included as in the drain's reading: what the drain's worker spent
    on anything but its jobs, to take away from its CPU."""
    db = b.new_db(f"idle-{tag}")  # made beforehand, as the drain's database was
    log = f"idle-{tag}.log"
    t0 = time.perf_counter()
    w = b.spawn(db, "worker", "start", "--count", "2", log=log, installed=True)
    try:
        time.sleep(max(0.0, wall_s - (time.perf_counter() - t0)))
        sample = proc_sample(w.pid)
    finally:
        b.stop_worker(db, w, log)
    if not sample:
        raise BenchError(f"idle {tag}: the worker vanished while measured")
    return sample["cpu_s"]


def cpu_figure(b: Bench, drains: list[dict], loop_cpu: list[float], n: int) -> None:
    """The worker's own CPU a job (less the idle worker's) against the plain loop parent's, paired runs."""
    own = [(d["self_cpu_s"] - d["idle_cpu_s"]) / n for d in drains if d.get("self_cpu_s") is not None]
    if len(own) != len(loop_cpu):
        b.add("cpu_ratio", CPU_LABEL, None, "x", why="a worker exited before /proc was read")
        return
    loop = [c / n for c in loop_cpu]
    b.raw["drain"]["own_cpu_ms"], b.raw["drain"]["loop_cpu_ms"] = [x * 1000 for x in own], [x * 1000 for x in loop]
    b.add("cpu_ratio", CPU_LABEL, statistics.median(w / l for w, l in zip(own, loop)), "x",
          f"worker {statistics.median(own) * 1000:.3f} ms, loop {statistics.median(loop) * 1000:.3f} ms a job "
          f"(medians of {len(own)} paired runs); the worker's /proc utime+stime less an idle worker's over the "
          "same wall time, the loop's getrusage")


CPU_LABEL = "1. drain: worker's own CPU a `true` job / the plain loop parent's"


def run_threads(target, threads: int) -> float:
    """Run `target` in `threads` threads at once until all return; the seconds that took."""
    t = time.perf_counter()
    pool = [threading.Thread(target=target) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return time.perf_counter() - t


def prototype_loop(n: int, path: str, threads: int = 2, cpu: list | None = None) -> float:
    """The floor of a queue that pays one SQLite transaction per job, at its simplest: a bare
    table with one index, 2 threads, each spawning `true` with os.posix_spawn (output pipe, new
    session) and, between jobs, one transaction that records the last result and claims the next.
    No run history, no retries, no leases: what is left of a job queue's work; jobs/s. Its CPU
    seconds (getrusage, as the plain loop's) are appended to `cpu`."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.executescript("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
                       "CREATE TABLE jobs (id INTEGER PRIMARY KEY, command TEXT, state TEXT, exit_code INTEGER,"
                       " output BLOB, updated_at REAL); CREATE INDEX jobs_state ON jobs (state, id);")
    with conn:
        conn.executemany("INSERT INTO jobs (command, state) VALUES (?, 'pending')", [("true",)] * n)
    lock, devnull = threading.Lock(), os.open(os.devnull, os.O_RDONLY)

    def next_job(done: tuple | None):
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            if done:
                conn.execute("UPDATE jobs SET state = 'completed', exit_code = ?, output = ?, updated_at = ? "
                             "WHERE id = ?", (done[1], done[2], time.time(), done[0]))
            row = conn.execute("UPDATE jobs SET state = 'processing', updated_at = ? WHERE id = (SELECT id FROM jobs "
                               "WHERE state = 'pending' ORDER BY id LIMIT 1) RETURNING id, command",
                               (time.time(),)).fetchone()
            conn.execute("COMMIT")
            return row

    program, errors = shutil.which("true") or "/bin/true", []

    def runner():
        done = None
        try:
            while (row := next_job(done)) is not None:
                r, w = os.pipe()
                pid = os.posix_spawn(program, ["true"], os.environ, setsid=True, file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
                os.close(w)
                with os.fdopen(r, "rb") as out:
                    output = out.read()
                done = (row[0], os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), output)
        except Exception as e:  # noqa: BLE001 - reported below: a thread's exception would only be printed
            errors.append(e)

    rate = n / with_cpu(cpu, lambda: run_threads(runner, threads))
    os.close(devnull)
    left = conn.execute("SELECT count(*) FROM jobs WHERE state != 'completed' OR exit_code != 0").fetchone()[0]
    conn.close()
    if errors or left:
        raise BenchError(f"the prototype did not run its {n} jobs: {errors[0] if errors else f'{left} not completed'}")
    return rate


def drain_figures(runs: list[dict], n: int) -> str:
    med = statistics.median
    walls = med(r["wall_s"] for r in runs)
    parts = [f"{n} jobs in {walls:.2f} s (median of {len(runs)})"]
    selfs = [r["self_cpu_s"] for r in runs if r["self_cpu_s"] is not None]
    totals = [r["total_cpu_s"] for r in runs if r["total_cpu_s"] is not None]
    if selfs and totals:
        parts.append(f"worker CPU {med(selfs) / n * 1000:.2f} ms/job, its `sh` children "
                     f"{(med(totals) - med(selfs)) / n * 1000:.2f} ms/job")
    return "; ".join(p for p in parts if p)


def bench_drain(b: Bench) -> None:
    n, reps = b.p["jobs"], b.p["repeats"]
    pg = not b.pg_why
    say(f"drain: {n} jobs x {reps}, queuectl{' on SQLite and PostgreSQL' if pg else ''} and the plain loop "
        "interleaved")
    loops, loop_cpu, protos, proto_cpu, drains, pg_drains, pg_error = [], [], [], [], [], [], None

    def pg_drain(i: int) -> None:
        nonlocal pg_error
        if pg and pg_error is None:
            try:
                with b.fresh(f"drain{i}", pg=True) as url:
                    pg_drains.append(drain_once(b, url, n, f"pg{i}"))
            except BenchError as e:
                pg_error = e

    for i in range(reps):
        # Alternate the order: this machine's speed drifts over seconds, and the runs of one round
        # should share it (even rounds: loop, SQLite, PostgreSQL; odd ones the reverse).
        db = b.new_db(f"drain{i}")
        if i % 2:
            pg_drain(i)
            drains.append(drain_once(b, db, n, f"empty{i}"))
        loops.append(plain_loop(n, cpu=loop_cpu))
        protos.append(prototype_loop(n, os.path.join(b.tmp, f"prototype{i}.db"), cpu=proto_cpu))
        if not i % 2:
            drains.append(drain_once(b, db, n, f"empty{i}"))
            pg_drain(i)
        drains[-1]["idle_cpu_s"] = idle_worker_cpu(b, drains[-1]["wall_s"], str(i))
        pg_say = f", PostgreSQL {pg_drains[-1]['rate']:,.0f} jobs/s" if pg and len(pg_drains) == i + 1 else ""
        say(f"  run {i + 1}: loop {loops[-1]:,.0f} jobs/s, prototype {protos[-1]:,.0f} jobs/s, "
            f"queuectl {drains[-1]['rate']:,.0f} jobs/s{pg_say}")
    ratio_ = statistics.median(d["rate"] / l for d, l in zip(drains, loops))
    b.raw["drain"] = {"loop_rates": loops, "queuectl": drains}
    b.raw["drain_rate"] = statistics.median(d["rate"] for d in drains)
    label = "1. drain: queuectl `worker start --burst --count 2` (installed)"
    b.add("drain_rate", label, b.raw["drain_rate"], "jobs/s", drain_figures(drains, n))
    b.add("loop_rate", "1. drain: plain stdlib loop, 2 threads", statistics.median(loops), "jobs/s",
          "Popen(['/bin/sh','-c','true'], new session, output captured)")
    b.add("drain_ratio", "1. drain: queuectl / plain loop", ratio_, "x",
          f"median of {reps} paired runs; the worker writes its default log lines")
    cpu_figure(b, drains, loop_cpu, n)
    b.raw["drain"]["prototype_rates"] = protos
    b.add("prototype_ratio", "1. drain: prototype (one transaction a job) / plain loop",
          statistics.median(p / l for p, l in zip(protos, loops)), "x",
          f"median of {reps} paired runs; no target: os.posix_spawn and one SQLite transaction a job on a "
          "bare table (no history, retries or leases), the ceiling of that design (prototype_loop)")
    b.add("prototype_cpu_ratio", "1. drain: prototype's CPU a job / the plain loop parent's",
          statistics.median(p / l for p, l in zip(proto_cpu, loop_cpu)), "x",
          f"median of {reps} paired runs; no target: the floor of the CPU ratio for a queue that writes one "
          f"transaction a job (prototype {statistics.median(proto_cpu) / n * 1000:.3f} ms a job)")
    drain_shell(b)
    drain_tsp(b)

    def record() -> None:
        if pg_error is not None:
            raise pg_error
        b.raw["pg_drain"] = pg_drains
        b.add("pg_drain_rate", label, statistics.median(d["rate"] for d in pg_drains), "jobs/s",
              drain_figures(pg_drains, n), pg=True)
        b.add("pg_loop_ratio", "1. drain: queuectl / plain loop",
              statistics.median(d["rate"] / l for d, l in zip(pg_drains, loops)), "x", pg=True)
        b.add("pg_drain_ratio", "1. drain: PostgreSQL / SQLite, same run",
              statistics.median(p["rate"] / d["rate"] for p, d in zip(pg_drains, drains)), "x",
              f"median of {reps} paired runs", pg=True)

    b.pg_measure([("pg_drain_rate", label, "jobs/s"), ("pg_loop_ratio", "1. drain: queuectl / plain loop", "x"),
                  ("pg_drain_ratio", "1. drain: PostgreSQL / SQLite, same run", "x")], record)


def drain_shell(b: Bench) -> None:
    """A command that needs the shell (`true; true`): queuectl runs it through `sh -c` as the plain loop
    does, so this ratio is the queue's own cost per job, with no exec'd-directly shortcut."""
    n, reps, command = b.p["jobs"], b.p["repeats"], "true; true"
    say(f"drain: {n} `{command}` jobs x {reps}, queuectl and the plain loop interleaved")
    loops, drains = [], []
    for i in range(reps):
        db = b.new_db(f"shell{i}")
        if i % 2:
            drains.append(drain_once(b, db, n, f"shell{i}", command))
        loops.append(plain_loop(n, command=command))
        if not i % 2:
            drains.append(drain_once(b, db, n, f"shell{i}", command))
        say(f"  run {i + 1}: loop {loops[-1]:,.0f} jobs/s, queuectl {drains[-1]['rate']:,.0f} jobs/s")
    b.raw["drain_shell"] = {"loop_rates": loops, "queuectl": drains}
    b.add("drain_shell_rate", f"1. drain `{command}`: queuectl", statistics.median(d["rate"] for d in drains),
          "jobs/s", drain_figures(drains, n))
    b.add("loop_shell_rate", f"1. drain `{command}`: plain loop, 2 threads", statistics.median(loops), "jobs/s",
          f"Popen(['/bin/sh','-c','{command}'], new session, output captured)")
    b.add("drain_shell_ratio", f"1. drain `{command}`: queuectl / plain loop",
          statistics.median(d["rate"] / l for d, l in zip(drains, loops)), "x",
          f"median of {reps} paired runs; the worker writes its default log lines")


# task-spooler keeps each queued job as a waiting client process with a connection to its server, and
# stops taking jobs near 1,000 outstanding: its drain is measured on at most this many.
TSP_MAX_JOBS = 800


def drain_tsp(b: Bench) -> None:
    """task-spooler (Debian's `task-spooler`, command `tsp`) draining `true` jobs with 2 slots, against
    queuectl's median drain of this run."""
    label = "1. drain: queuectl / task-spooler (2 slots)"
    tsp = shutil.which("tsp")
    if tsp is None:
        b.add("tsp_ratio", label, None, "x", why="not installed (Debian package task-spooler)")
        return
    n = min(b.p["jobs"], TSP_MAX_JOBS)
    runs = max(1, min(3, b.p["repeats"]))
    say(f"drain: task-spooler, {n} `true` jobs x {runs}")
    rates = [tsp_drain_once(b, tsp, n, i) for i in range(runs)]
    b.raw["tsp_rates"] = rates
    b.add("tsp_rate", "1. drain: task-spooler `tsp -S 2`", statistics.median(rates), "jobs/s",
          f"{n} jobs (median of {runs}); it holds each queued job as a waiting process, so at most {TSP_MAX_JOBS}")
    b.add("tsp_ratio", label, ratio(b.raw["drain_rate"], statistics.median(rates)), "x",
          "queuectl's median drain rate of this run")


def tsp_drain_once(b: Bench, tsp: str, n: int, i: int) -> float:
    """Queue n `true` jobs behind a job that waits for a file, release it, time until all finished; jobs/s."""
    folder = os.path.join(b.tmp, f"tsp{i}")
    os.mkdir(folder)
    env = {**b.env, "TS_SOCKET": os.path.join(folder, "socket"), "TMPDIR": folder, "TS_MAXFINISHED": str(n + 10)}
    go = os.path.join(folder, "go")

    def ts(*args: str) -> str:
        r = subprocess.run([tsp, *args], capture_output=True, text=True, env=env, cwd=folder, timeout=120,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise BenchError(f"`tsp {shlex.join(args)}` exited {r.returncode}: {r.stderr.strip()[-300:]}")
        return r.stdout
    try:
        ts("-S", "1")
        ts("sh", "-c", f"while [ ! -e {shlex.quote(go)} ]; do sleep 0.005; done")
        for _ in range(n):
            ts("true")
        t = time.perf_counter()
        with open(go, "w"):
            pass
        ts("-S", "2")
        ts("-w")
        deadline = time.monotonic() + 60
        while sum(line.split()[1:2] == ["finished"] for line in ts("-l").splitlines()) < n + 1:
            if time.monotonic() > deadline:
                raise BenchError(f"task-spooler did not finish {n} jobs within 60 s after the last one")
            time.sleep(0.005)
        return n / (time.perf_counter() - t)
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            open(go, "a").close()  # the waiting job ends, whatever failed
            subprocess.run([tsp, "-K"], env=env, capture_output=True, timeout=30)


PG_IMPORT = "import sqlite3, argparse, json, psycopg"


def bench_enqueue(b: Bench) -> None:
    runs = b.p["enqueue_runs"]
    pg = not b.pg_why
    say(f"enqueue: one job per process, {runs} runs each, interleaved"
        + (", on SQLite and PostgreSQL" if pg else ""))
    label, ratio_label = "2. enqueue one job (median wall)", "2. enqueue / python import"
    pg_rows = [("pg_enqueue_ms", label, "ms"), ("pg_import_ms", f'2. python3 -c "{PG_IMPORT}"', "ms"),
               ("pg_enqueue_ratio", ratio_label, "x")]
    with contextlib.ExitStack() as stack:
        db = b.new_db("enqueue")
        commands = {"mine": b.argv(db, "enqueue", '{"command": "true"}'),
                    "base": [PY, "-c", "import sqlite3, argparse, json"]}
        pg_error = None
        envs = {}
        if pg:
            try:
                url = stack.enter_context(b.fresh("enqueue", pg=True))
                # On PostgreSQL, as users run the command: a copied file from its cached bytecode (see
                # bench_startup). `python3 queuectl.py` compiles the whole file on every run.
                copy = os.path.join(b.tmp, "queuectl-pg")
                shutil.copyfile(QUEUECTL, copy)
                os.chmod(copy, 0o755)
                commands.update(pg_mine=[copy, "--db", url, "enqueue", '{"command": "true"}'],
                                pg_base=[PY, "-c", PG_IMPORT])
                envs = {"pg_mine": launcher_env(b), "pg_base": launcher_env(b)}
            except BenchError as e:
                pg_error = e
        for name, argv in commands.items():  # warm the page cache (and fill the bytecode cache)
            b.timed(argv, env=envs.get(name))
        times = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                wall, r = b.timed(argv, env=envs.get(name))
                if r.returncode != 0:
                    e = BenchError(f"{'PostgreSQL ' if name.startswith('pg') else ''}enqueue exited "
                                   f"{r.returncode}: {r.stderr.strip()[-400:]}")
                    if not name.startswith("pg"):
                        raise e
                    pg_error = pg_error or e
                times[name].append(wall * 1000)
    med = {name: statistics.median(t) for name, t in times.items()}
    b.raw["enqueue_ms"], b.raw["python_import_ms"] = times["mine"], times["base"]
    b.add("enqueue_ms", label, med["mine"], "ms", f"{runs} runs")
    b.add("import_ms", '2. python3 -c "import sqlite3, argparse, json"', med["base"], "ms", f"{runs} runs")
    b.add("enqueue_ratio", ratio_label, ratio(med["mine"], med["base"]), "x",
          "`python3 queuectl.py`, which compiles the file every run: the start-up rows hold the target")

    def record() -> None:
        if pg_error is not None:
            raise pg_error
        b.raw["pg_enqueue_ms"], b.raw["pg_import_ms"] = times["pg_mine"], times["pg_base"]
        b.add("pg_enqueue_ms", label, med["pg_mine"], "ms", f"{runs} runs, durable commit", pg=True)
        b.add("pg_import_ms", f'2. python3 -c "{PG_IMPORT}"', med["pg_base"], "ms", f"{runs} runs", pg=True)
        b.add("pg_enqueue_ratio", ratio_label, ratio(med["pg_mine"], med["pg_base"]), "x",
              "a copied `./queuectl` (cached bytecode) against the import with psycopg", pg=True)

    b.pg_measure(pg_rows, record)


def bench_startup(b: Bench) -> None:
    """The one-job enqueue as users install the command, with bytecode writing on (users normally have
    PYTHONDONTWRITEBYTECODE unset), each from its second run on, against the plain import."""
    runs = b.p["enqueue_runs"]
    say(f"startup: one-job enqueue as installed, {runs} runs each after a first, interleaved")
    env = launcher_env(b)
    db, job = b.new_db("startup"), '{"command": "true"}'
    commands = {"base": [PY, "-c", "import sqlite3, argparse, json"]}
    commands.update(startup_commands(b, db, job, env))
    for argv in commands.values():  # the first run: it compiles and caches the bytecode
        b.timed(argv, env=env)
    times = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            wall, r = b.timed(argv, env=env)
            if r.returncode != 0:
                raise BenchError(f"startup {name}: exited {r.returncode}: {r.stderr.strip()[-400:]}")
            times[name].append(wall * 1000)
    med = {name: statistics.median(t) for name, t in times.items()}
    b.raw["startup_ms"] = times
    base = med["base"]
    b.add("startup_import_ms", '2. startup: python3 -c "import sqlite3, argparse, json"', base, "ms",
          f"{runs} runs, bytecode writing on")
    for key, label in (("copy", "a copied `./queuectl`"), ("install", "`make install`'s `queuectl`"),
                       ("module", "`python3 -m queuectl`"), ("script", "`python3 queuectl.py` (compiles)")):
        if key in med:
            b.add(f"startup_{key}_ratio", f"2. startup: {label} enqueue / import", ratio(med[key], base), "x",
                  f"{med[key]:.1f} ms")
        else:
            b.add(f"startup_{key}_ratio", f"2. startup: {label} enqueue / import", None, "x",
                  why="`make install` did not work here")


def launcher_env(b: Bench) -> dict:
    """The environment of a command run as users install it: bytecode writing on, `python3` on PATH the
    interpreter of this run (the launcher execs python3: a version-manager shim in front would measure
    the shim), and the bytecode cache in this run's folder."""
    env = {k: v for k, v in b.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    env["XDG_CACHE_HOME"] = os.path.join(b.tmp, "cache")
    return env


def startup_commands(b: Bench, db: str, job: str, env: dict) -> dict[str, list[str]]:
    """The one-job enqueue through each way of installing queuectl, from copies in this run's folder."""
    folder = os.path.join(b.tmp, "startup")
    os.mkdir(folder)
    copy = os.path.join(b.tmp, "queuectl")  # run as ./queuectl from the commands' folder
    shutil.copyfile(QUEUECTL, copy)
    os.chmod(copy, 0o755)
    module = os.path.join(folder, "module")
    os.mkdir(module)
    shutil.copyfile(QUEUECTL, os.path.join(module, "queuectl.py"))
    env["PYTHONPATH"] = module
    args = ["--db", db, "enqueue", job]
    commands = {"copy": ["./queuectl", *args]}
    prefix = os.path.join(folder, "prefix")
    make = ["make", "-s", "-C", os.path.dirname(QUEUECTL), "-f", os.path.join(ROOT, "Makefile"), "install",
            f"PREFIX={prefix}"]
    r = subprocess.run(make,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=60) \
        if shutil.which("make") else None
    if r is not None and r.returncode == 0:
        commands["install"] = [os.path.join(prefix, "bin", "queuectl"), *args]
    commands["module"] = [PY, "-m", "queuectl", *args]
    commands["script"] = [PY, QUEUECTL, *args]
    return commands


def bench_batch(b: Bench) -> None:
    n = b.p["batch"]
    label = f"3. batch enqueue of {n:,} jobs (`enqueue -`)"
    if not b.batch_ok:
        b.add("batch_rate", label, None, "jobs/s", why="`enqueue -` missing in this queuectl")
        b.add("pg_batch_rate", label, None, "jobs/s", why=b.pg_why or "`enqueue -` missing in this queuectl",
              pg=True)
        return
    say(f"batch: {n:,} jobs through `enqueue -`")
    lines = "".join(json.dumps({"command": "true"}) + "\n" for _ in range(n))

    def batch(db: str, what: str) -> float:
        wall, r = b.timed(b.argv(db, "enqueue", "-"), stdin=lines)
        if r.returncode != 0 or len(r.stdout.splitlines()) != n:
            raise BenchError(f"{what}enqueue - of {n} jobs: exit {r.returncode}, {len(r.stdout.splitlines())} ids; "
                             f"{r.stderr.strip()[-400:]}")
        if b.counts(db)["pending"] != n:
            raise BenchError(f"{what}batch enqueue: pending count does not match")
        return wall

    wall = b.raw["batch_wall_s"] = batch(b.new_db("batch"), "")
    b.add("batch_rate", label, n / wall, "jobs/s", f"{wall:.2f} s for the whole command, start-up included")

    def measure() -> None:
        say(f"batch: {n:,} jobs through `enqueue -` on PostgreSQL")
        with b.fresh("batch", pg=True) as url:
            pg_wall = b.raw["pg_batch_wall_s"] = batch(url, "PostgreSQL: ")
        b.add("pg_batch_rate", label, n / pg_wall, "jobs/s", f"{pg_wall:.2f} s for the whole command", pg=True)

    b.pg_measure([("pg_batch_rate", label, "jobs/s")], measure)


def pickup(b: Bench, db: str, tag: str) -> dict | None:
    """Latencies (ms) to the job's command starting, with an idle worker, measured from three moments
    of each `enqueue`: its process exiting ("returned", the figure with a target), its id printed
    (commit acknowledged: the process then still tears down, so the job may start before it exits),
    and its process being started (end to end, always positive: the scale ratio uses this one).
    None if they cannot be measured here (b.clock_why says why)."""
    if b.clock_why:
        return None
    n = b.p["pickup_jobs"]
    marks = os.path.join(b.tmp, f"marks-{tag}")
    os.mkdir(marks)
    log = f"pickup-{tag}.log"
    w = b.spawn(db, "worker", "start", log=log)
    moments = {}
    try:
        b.wait_log(w, log, "worker started")
        time.sleep(b.p["settle_seconds"])
        for i in range(n):
            time.sleep(b.rng.uniform(0.05, 0.3))
            job_id = f"{tag}-{i}"
            # The command records its own start: `date` is exec'd by the job's shell, no Python start-up.
            cmd = f"echo $(date +%s%N) > {shlex.quote(marks)}/$QUEUECTL_JOB_ID"
            moments[job_id] = enqueue_moments(b, db, {"id": job_id, "command": cmd})
        started = wait_marks(marks, moments, timeout_s=30)
    finally:
        b.stop_worker(db, w, log)
    return {key: [(started[j] - moments[j][key]) / 1e6 for j in moments] for key in ("returned", "acked", "spawned")}


def enqueue_moments(b: Bench, db: str, job: dict) -> dict:
    """Run one `enqueue`, noting (time_ns) when it was started, printed its id, and exited."""
    spawned = time.time_ns()
    p = subprocess.Popen(b.argv(db, "enqueue", json.dumps(job)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=b.tmp, env=b.env)
    # stdout is a pipe, so the id arrives when queuectl flushes it: after the commit, at the latest as the
    # interpreter starts to shut down. select() keeps a hung enqueue from hanging the benchmark.
    line = p.stdout.readline() if select.select([p.stdout], [], [], 60)[0] else b""
    acked = time.time_ns()
    _, err = p.communicate(timeout=60)
    returned = time.time_ns()
    if p.returncode != 0 or line.decode().strip() != job["id"]:
        raise BenchError(f"enqueue exited {p.returncode}: {err.decode(errors='replace').strip()[-400:]}")
    return {"spawned": spawned, "acked": acked, "returned": returned}


def wait_marks(folder: str, ids: dict, timeout_s: float) -> dict:
    deadline, found = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        for job_id in ids:
            if job_id not in found:
                try:
                    with open(os.path.join(folder, job_id)) as f:
                        text = f.read()
                except FileNotFoundError:
                    continue
                if text.endswith("\n"):
                    found[job_id] = int(text)
        if len(found) == len(ids):
            return found
        time.sleep(0.02)
    raise BenchError(f"pickup: only {len(found)} of {len(ids)} jobs started within {timeout_s:g}s")


def latency_detail(lat: dict | None) -> str:
    if not lat or not lat["returned"]:
        return ""
    ret, ack, e2e = lat["returned"], lat["acked"], lat["spawned"]
    return (f"{len(ret)} jobs 50–300 ms apart; from exit: min {min(ret):.1f}, max {max(ret):.1f} ms; "
            f"p50 from id printed {percentile(ack, 50):.1f} ms, from enqueue start {percentile(e2e, 50):.1f} ms")


def pickup_figures(b: Bench, lat: dict | None, key: str, label: str, ratio_label: str = "",
                   versus: str = "", pg: bool = False) -> None:
    """Record p50 and p95 of `lat` (from enqueue exit) as key_p50/key_p95 (labels: `label` with {p});
    with `ratio_label`, also the ratios of the empty queue's end-to-end latencies to these
    (key_p50_ratio, key_p95_ratio; `versus` names this measurement in the detail)."""
    why = b.clock_why if lat is None else "" if lat["returned"] else "no job was timed"
    values = lat["returned"] if lat else []
    b.add(f"{key}_p50", label.format(p=50), percentile(values, 50), "ms", latency_detail(lat), why=why, pg=pg)
    b.add(f"{key}_p95", label.format(p=95), percentile(values, 95), "ms", why=why, pg=pg)
    if not ratio_label:
        return
    # Latencies from the enqueue's exit can be near zero or negative, so their ratio means nothing; the
    # ratio compares enqueue start -> job start, which also covers the enqueue into the bigger table.
    base = b.raw.get("pickup_ms")
    for pct in (50, 95):
        empty = percentile(base["spawned"], pct) if base else None
        full = percentile(lat["spawned"], pct) if lat else None
        detail, rwhy = "", why
        if not rwhy and "pickup" not in b.sections:
            rwhy = "needs the pickup section's figures (it did not run)"
        elif not rwhy and base is None:
            rwhy = b.clock_why or "the empty queue's pickup was not measured"
        if empty is not None and full is not None:
            detail = f"{empty:.1f} ms empty, {full:.1f} ms {versus}"
        b.add(f"{key}_p{pct}_ratio", ratio_label.format(p=pct), ratio(empty, full), "x", detail, why=rwhy)


def bench_pickup(b: Bench) -> None:
    say(f"pickup: {b.p['pickup_jobs']} jobs, one at a time, idle `worker start`")
    label = "4. pickup latency p{p} (from enqueue exit)"
    ack_label = "4. wake-up: pickup latency p{p} (from the id printed: its commit)"
    lat = pickup(b, b.new_db("pickup"), "empty")
    if lat is not None:
        b.raw["pickup_ms"] = lat
    pickup_figures(b, lat, "pickup", label)
    # The targets are judged from the id printed, the commit acknowledged: the stricter, since an
    # `enqueue` exits some milliseconds after its commit (on PostgreSQL 30-70 ms, psycopg's teardown),
    # and the job often starts before that.
    for pct in (50, 95):
        b.add(f"pickup_ack_p{pct}", ack_label.format(p=pct), percentile(lat["acked"], pct) if lat else None, "ms",
              why=b.clock_why)

    def measure() -> None:
        say(f"pickup: {b.p['pickup_jobs']} jobs on PostgreSQL")
        with b.fresh("pickup", pg=True) as url:
            pg_lat = b.raw["pg_pickup_ms"] = pickup(b, url, "pg")
        why = b.clock_why if pg_lat is None else "" if pg_lat["acked"] else "no job was timed"
        for pct in (50, 95):
            b.add(f"pg_pickup_exit_p{pct}", label.format(p=pct),
                  percentile(pg_lat["returned"], pct) if pg_lat else None, "ms",
                  latency_detail(pg_lat) if pct == 50 else "", why=why, pg=True)
        for pct in (50, 95):
            b.add(f"pg_pickup_p{pct}", ack_label.format(p=pct), percentile(pg_lat["acked"], pct) if pg_lat else None,
                  "ms", why=why, pg=True)

    b.pg_measure([(f"pg_pickup_exit_p{p}", label.format(p=p), "ms") for p in (50, 95)]
                 + [(f"pg_pickup_p{p}", ack_label.format(p=p), "ms") for p in (50, 95)], measure)


def idle_cpu(b: Bench, db: str, tag: str, secs: float, server: bool = False) -> dict:
    """CPU seconds that `worker start --count 4` uses over `secs` with nothing it may claim; with server,
    also those of the PostgreSQL server's client backends (server_cpu_s: None if they cannot be read)."""
    log = f"idle-{tag}.log"
    w = b.spawn(db, "worker", "start", "--count", "4", log=log)
    try:
        b.wait_log(w, log, "worker started")
        time.sleep(b.p["settle_seconds"])
        c0 = b.pg_backend_cpu() if server else None
        s0, t0 = proc_sample(w.pid), time.monotonic()
        time.sleep(secs)
        s1, t1 = proc_sample(w.pid), time.monotonic()
        c1 = b.pg_backend_cpu() if server else None
    finally:
        b.stop_worker(db, w, log)
    if not s0 or not s1:
        raise BenchError(f"idle {tag}: the worker vanished while measured")
    idle = {"cpu_s": s1["cpu_s"] - s0["cpu_s"], "wall_s": t1 - t0, "threads": s1["threads"]}
    if server:
        # Backends alive at both readings: the worker's connections (and any other client's).
        both = set(c0 or ()) & set(c1 or ())
        idle["server_cpu_s"] = sum(c1[pid] - c0[pid] for pid in both) if both else None
        idle["server_backends"] = len(both)
    return idle


def idle_figure(b: Bench, key: str, label: str, idle: dict, detail: str = "", pg: bool = False) -> None:
    """Record an idle cost in % of one core. CPU time is counted in clock ticks, so the figure is only
    as fine as one tick over the time measured: coarser than the target (a short measurement), it can
    neither meet nor miss it and is not measured; a reading of no tick at all says "under one tick"."""
    pct = ratio(idle["cpu_s"] * 100, idle["wall_s"])
    tick = ratio(100 / CLK_TCK, idle["wall_s"])
    detail = f"{detail}; " if detail else ""
    detail += f"{idle['cpu_s']:.2f} CPU s in {idle['wall_s']:.1f} s; {idle['threads']} OS threads"
    why = ""
    if pct is None or tick is None:
        why = f"measured over {idle['wall_s']:.3f} s"
    elif key in TARGETS and tick > TARGETS[key][1]:
        why = f"{idle['wall_s']:.1f} s is too short for the target: one clock tick is {tick:.2f} % of it"
    elif idle["cpu_s"] == 0:
        detail += f"; no clock tick: under {tick:.2f} %"
    b.add(key, label, pct, "%", detail, why=why, pg=pg)


def bench_idle(b: Bench) -> None:
    say(f"idle: `worker start --count 4` with nothing to do for {b.p['idle_seconds']:g} s")
    label = "5. idle cost, 4 threads (% of one core)"
    idle = b.raw["idle"] = idle_cpu(b, b.new_db("idle"), "empty", b.p["idle_seconds"])
    idle_figure(b, "idle_pct", label, idle)

    def measure() -> None:
        say(f"idle: the same on PostgreSQL, the server's backends counted too")
        with b.fresh("idle", pg=True) as url:
            pg_idle = b.raw["pg_idle"] = idle_cpu(b, url, "pg", b.p["idle_seconds"], server=True)
        server = pg_idle["server_cpu_s"]
        if server is None:
            detail = "worker only: the server's backends could not be read (not on this machine?)"
        else:
            detail = (f"worker {pg_idle['cpu_s']:.2f} + server backends {server:.2f} CPU s "
                      f"({pg_idle['server_backends']} connections)")
            pg_idle = {**pg_idle, "cpu_s": pg_idle["cpu_s"] + server}
        idle_figure(b, "pg_idle_pct", label, pg_idle, detail, pg=True)

    b.pg_measure([("pg_idle_pct", label, "%")], measure)


# ---- parallel ----------------------------------------------------------------------------------

PARALLEL_CMD = "sleep 0.05"


def parallel_once(b: Bench, db: str, procs: int, n: int, tag: str) -> dict:
    """Enqueue n `sleep 0.05` jobs, then time `procs` burst workers of 4 threads each, started together,
    until the last has exited; check every job completed. Returns the rate and each process's claims."""
    before = b.counts(db)
    b.enqueue_many(db, [{"command": PARALLEL_CMD}] * n)
    logs = [f"parallel-{tag}-{k}.log" for k in range(procs)]
    t0 = time.perf_counter()
    ps = [b.spawn(db, "worker", "start", "--burst", "--count", "4", log=log) for log in logs]
    deadline = t0 + 120 + n * 0.05
    try:
        while True:
            for p in ps:
                b.poll_exit(p)
            now = time.perf_counter()
            if all(p.returncode is not None for p in ps):
                break
            if now > deadline:
                raise BenchError(f"parallel {tag}: workers still running after {deadline - t0:.0f} s:\n"
                                 f"{b.log_tail(logs[0])}")
            time.sleep(0.005)
    finally:
        for p in ps:
            b.kill(p)  # nothing to do for one that exited
    wall = now - t0
    if any(p.returncode != 0 for p in ps):
        raise BenchError(f"parallel {tag}: workers exited {[p.returncode for p in ps]}:\n{b.log_tail(logs[0])}")
    after = b.counts(db)
    if after["completed"] - before["completed"] != n:
        raise BenchError(f"parallel {tag}: {after['completed'] - before['completed']} of {n} jobs completed")
    claims, spans = [], []
    for log in logs:
        with open(os.path.join(b.tmp, log), errors="replace") as f:
            claims.append(sum(1 for line in f if " claimed" in line))
        spans.append(log_span(os.path.join(b.tmp, log)))
    # Jobs/s from the first claim to the last completion of any process: the rate without the
    # processes' start-up and exit (None if the logs have no timestamps to read).
    firsts, lasts = [f for f, _ in spans if f is not None], [x for _, x in spans if x is not None]
    steady = n / (max(lasts) - min(firsts)) if firsts and lasts and max(lasts) > min(firsts) else None
    return {"rate": n / wall, "wall_s": wall, "claims": claims, "steady_rate": steady}


def bench_parallel(b: Bench) -> None:
    n, reps = b.p["parallel_jobs"], b.p["parallel_repeats"]
    say(f"parallel: {n} `{PARALLEL_CMD}` jobs, one `worker start --burst --count 4` process, then two, x {reps}")
    one_label, two_label = "9. parallel: one `worker start --burst --count 4`", "9. parallel: two such processes at once"
    ratio_label = "9. parallel: two processes / one"

    def measure(pg: bool) -> None:
        key = "pg_parallel" if pg else "parallel"
        ones, twos = [], []
        for i in range(reps):
            for procs in ((1, 2) if i % 2 == 0 else (2, 1)):  # alternate which goes first
                with b.fresh(f"parallel{procs}_{i}", pg=pg) as db:
                    run = parallel_once(b, db, procs, n, f"{key}{procs}-{i}")
                (ones if procs == 1 else twos).append(run)
            say(f"  run {i + 1}{' PostgreSQL' if pg else ''}: one process {ones[-1]['rate']:,.1f} jobs/s, "
                f"two {twos[-1]['rate']:,.1f} jobs/s (claims {'/'.join(map(str, twos[-1]['claims']))})")
        b.raw[key] = {"one": ones, "two": twos}
        med = statistics.median
        walls = lambda runs: "/".join(f"{r['wall_s']:.2f}" for r in runs)  # noqa: E731
        b.add(f"{key}_one_rate", one_label, med(r["rate"] for r in ones), "jobs/s",
              f"{n} jobs; each run's seconds {walls(ones)}", pg=pg)
        b.add(f"{key}_two_rate", two_label, med(r["rate"] for r in twos), "jobs/s",
              f"{n} jobs; each run's seconds {walls(twos)}; jobs claimed by each process: "
              + ", ".join("/".join(map(str, r["claims"])) for r in twos), pg=pg)
        steady = [t["steady_rate"] / o["steady_rate"] for o, t in zip(ones, twos)
                  if t["steady_rate"] and o["steady_rate"]]
        b.add(f"{key}_ratio", ratio_label, med(t["rate"] / o["rate"] for o, t in zip(ones, twos)), "x",
              f"median of {reps} paired runs; the ceiling is 2"
              + (f"; first claim to last completion: {med(steady):.2f}" if steady else ""), pg=pg)

    measure(False)
    b.pg_measure([("pg_parallel_one_rate", one_label, "jobs/s"), ("pg_parallel_two_rate", two_label, "jobs/s"),
                  ("pg_parallel_ratio", ratio_label, "x")], lambda: measure(True))


# ---- scale -------------------------------------------------------------------------------------

def fill_history(b: Bench, db: str, rows: int, span_s: float) -> None:
    """Insert `rows` completed jobs, one run each, straight into queuectl's schema.

    The schema is not assumed: one real job is enqueued and run by queuectl, and its rows in every
    table that mentions it serve as templates, so each column (known or not) gets a value queuectl
    itself wrote. Ids are new and random; every numeric `*_at` column is shifted so the jobs spread
    evenly over `span_s` seconds before the last hour, in whatever unit queuectl stores, and each run
    gets a random wait (0-2 s) and duration (mean 1 s).
    """
    b.qc(db, "enqueue", json.dumps({"id": "scale-template", "command": "true"}))
    b.run_to_exit(db, "worker", "start", "--burst", log="scale-template.log", timeout_s=120)
    con = sqlite3.connect(db, isolation_level=None)
    con.row_factory = sqlite3.Row
    try:
        _insert_history(b, con, rows, span_s)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as a long-lived database would be
    finally:
        con.close()


def _columns(con, table: str) -> tuple[list[str], str | None]:
    """(column names, the rowid alias column if the table has one)."""
    info = con.execute(f"PRAGMA table_info({table})").fetchall()
    pks = [c for c in info if c["pk"]]
    alias = pks[0]["name"] if len(pks) == 1 and pks[0]["type"].upper() == "INTEGER" else None
    return [c["name"] for c in info], alias


def _insert_history(b: Bench, con, rows: int, span: float) -> None:
    job_cols, job_alias = _columns(con, "jobs")
    tjob = dict(con.execute("SELECT * FROM jobs WHERE id = 'scale-template'").fetchone())
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "AND name NOT IN ('jobs', 'workers', 'config') AND name NOT LIKE 'sqlite_%'")]
    children = {}  # other tables: their rows that belong to the template job
    for table in tables:
        cols, alias = _columns(con, table)
        trows = [dict(r) for r in con.execute(f"SELECT * FROM {table}")
                 if tjob["id"] in tuple(r)]
        if trows:
            children[table] = (cols, alias, trows)
    b.notes.append(f"scale rows copy the template job's rows in: jobs, {', '.join(children) or '(no other table)'}"
                   f"; schema tables: {', '.join(['jobs'] + tables + ['workers', 'config'])}")
    created = tjob["created_at"]
    unit = 1e6 if created > 1e14 else 1e3 if created > 1e11 else 1.0
    newest = time.time() - 3600 - 300
    base_seq = (con.execute(f"SELECT max({job_alias}) FROM jobs").fetchone()[0] or 0) + 1 if job_alias else None
    rng = random.Random(b.p["seed"])

    # Every copy would otherwise have the template's wait and duration: give each its own, so sorts
    # and percentiles over the history see realistic, distinct values.
    started_cols, ended_cols = {"started_at"}, {"ended_at", "updated_at", "finished_at"}

    def shifted(col: str, value, shift: float, wait: float, took: float):
        if col.endswith("_at") and isinstance(value, (int, float)) and not isinstance(value, bool):
            extra = wait if col in started_cols else wait + took if col in ended_cols else 0.0
            return type(value)(value + shift + extra * unit)
        return value

    def row_values(i: int):
        new_id = f"{rng.getrandbits(64):016x}"
        shift = (newest - span + span * i / rows - created / unit) * unit
        wait, took = rng.uniform(0, 2), rng.expovariate(1.0)
        seq = base_seq + i if job_alias else None
        job = [seq if c == job_alias else new_id if c == "id" else shifted(c, tjob[c], shift, wait, took)
               for c in job_cols]
        kids = {}
        for table, (cols, alias, trows) in children.items():
            kids[table] = [[None if c == alias else new_id if r[c] == tjob["id"]
                            else seq if job_alias and c != alias and r[c] == tjob[job_alias] and "job" in c
                            else shifted(c, r[c], shift, wait, took) for c in cols] for r in trows]
        return job, kids

    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA cache_size = -400000")
    t = time.perf_counter()
    chunk = 50_000
    con.execute("BEGIN")
    for start in range(0, rows, chunk):
        jobs, kids = [], {table: [] for table in children}
        for i in range(start, min(rows, start + chunk)):
            job, k = row_values(i)
            jobs.append(job)
            for table, rws in k.items():
                kids[table].extend(rws)
        con.executemany(f"INSERT INTO jobs ({', '.join(job_cols)}) VALUES ({', '.join('?' * len(job_cols))})", jobs)
        for table, rws in kids.items():
            cols = children[table][0]
            con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rws)
    con.execute("COMMIT")
    b.raw["scale_insert_s"] = time.perf_counter() - t
    say(f"  inserted {rows:,} jobs (+ {', '.join(children)}) in {b.raw['scale_insert_s']:.1f} s")


def history_span(b: Bench, db: str) -> float:
    """Seconds the old jobs spread over: --scale-days, but inside the retention window if queuectl has one,
    since workers delete completed jobs older than it (a million older rows is not a steady state)."""
    span = b.p["scale_days"] * 86400
    r = b.qc(db, "config", "get", "retention", check=False)
    try:
        retention = float(r.stdout) if r.returncode == 0 else 0.0
    except ValueError:
        retention = 0.0
    if retention and span > retention - 7200:
        span = retention - 7200
        b.notes.append(f"scale: the old jobs spread over {span / 86400:.1f} days, not {b.p['scale_days']:g}: "
                       f"the default retention ({retention / 86400:g} days) would delete older ones")
    b.raw["scale_span_days"] = span / 86400
    return span


def time_command(b: Bench, db: str, args: list[str], runs: int) -> tuple[float | None, str]:
    """Median wall time of a read command; (None, why) if it failed (e.g. not implemented yet)."""
    walls = []
    for _ in range(runs):
        wall, r = b.timed(b.argv(db, *args))
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            why = lines[-1].removeprefix("queuectl: error: ") if lines else ""
            return None, f"exit {r.returncode}: {why[:70]}"
        walls.append(wall)
    return statistics.median(walls), ""


QUERIES = [("scale_status", "status", ["status"]),
           ("scale_list", "list --state pending --limit 50", ["list", "--state", "pending", "--limit", "50"]),
           ("scale_stats", "stats (default window)", ["stats"]),
           ("scale_stats_30d", "stats --since 30d", ["stats", "--since", "30d"])]


# Shell completion's values: (key, label, the words after `queuectl --db DB`, the last one under the cursor)
COMPLETIONS = [("scale_complete_ids", "job ids by prefix (`show 3f`)", ["show", "3f"]),
               ("scale_complete_dead", "dead job ids (`dlq retry `)", ["dlq", "retry", ""]),
               ("scale_complete_queues", "queue names (`list --queue `)", ["list", "--queue", ""])]


def time_completions(b: Bench, argvs: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    """Wall times in ms of each command, `runs` rounds interleaved (a busy moment hits all alike), after a
    first untimed round; a failed command raises BenchError."""
    env, times = launcher_env(b), {name: [] for name in argvs}
    for round_no in range(runs + 1):
        for name, argv in argvs.items():
            wall, r = b.timed(argv, env=env)
            if r.returncode != 0:
                raise BenchError(f"completion {name}: exited {r.returncode}: {r.stderr.strip()[-400:]}")
            if round_no:
                times[name].append(wall * 1000)
    return times


def bench_completion(b: Bench, db: str, small: str, rows: int) -> None:
    """`__complete` as bash's script runs it at a Tab, from the installed copy (cached bytecode: the module
    is loaded at each Tab), on the million-job queue and a small one, beside the plain import."""
    copy, _ = b.installed()
    argvs = {"import": [PY, "-c", "import sqlite3, argparse, json"]}
    for key, _, words in COMPLETIONS:
        for name, database in ((key, db), (f"{key}_small", small)):
            line = shlex.join(["queuectl", "--db", database, *words[:-1]]) + " " + words[-1]
            argvs[name] = [copy, "__complete", "bash", line, words[-1]]
    values = subprocess.run(argvs[COMPLETIONS[0][0]], capture_output=True, text=True, env=launcher_env(b)).stdout
    times = time_completions(b, argvs, max(10, b.p["query_runs"]))
    b.raw["completion_ms"] = times
    med = {name: statistics.median(t) for name, t in times.items()}
    for key, label, _ in COMPLETIONS:
        why = "" if key != COMPLETIONS[0][0] or values.strip() else "it offered no ids"
        b.add(key, f"6. completion: {label} with {rows:,} old jobs", med[key], "ms",
              f"{len(times[key])} runs; a small db: {med[f'{key}_small']:.1f} ms; the import alone: "
              f"{med['import']:.1f} ms", why=why)


def drain_ratio_figure(b: Bench, key: str, label: str, rate: float) -> None:
    """Record rate / the empty queue's drain rate (from the drain section)."""
    why = "" if "drain_rate" in b.raw else "needs the drain section's figure (it did not run)"
    b.add(key, label, ratio(rate, b.raw.get("drain_rate")), "x", why=why)


def bench_scale(b: Bench) -> None:
    rows, n = b.p["scale_rows"], b.p["jobs"]
    say(f"scale: {rows:,} finished jobs with their runs, then drain, pickup and read commands")
    db = b.new_db("scale")
    fill_history(b, db, rows, history_span(b, db))
    seen = b.counts(db)["completed"]
    if seen < rows:
        b.notes.append(f"status counts {seen} completed jobs after inserting {rows}: the direct inserts may miss "
                       "a table queuectl maintains itself")
    drains = [drain_once(b, db, n, f"scale{i}") for i in range(b.p["repeats"])]
    rate = statistics.median(d["rate"] for d in drains)
    b.raw["scale"] = {"drain": drains}
    b.add("scale_drain_rate", f"6. drain with {rows:,} old jobs", rate, "jobs/s", drain_figures(drains, n))
    drain_ratio_figure(b, "scale_drain_ratio", "6. drain: scale / empty", rate)
    lat = b.raw["scale"]["pickup_ms"] = pickup(b, db, "scale")
    pickup_figures(b, lat, "scale_pickup", "6. pickup p{p} with old jobs (from enqueue exit)",
                   "6. pickup p{p}, enqueue start → job start: empty / scale", "at scale")
    b.enqueue_many(db, [{"command": "true"}] * b.p["list_pending"])  # something for `list --state pending`
    small = b.new_db("small")
    b.enqueue_many(small, [{"command": "true"}] * b.p["list_pending"])
    for key, label, args in QUERIES:
        wall, why = time_command(b, db, args, b.p["query_runs"])
        empty, _ = time_command(b, small, args, b.p["query_runs"])
        detail = why or (f"same command on a small db: {empty:.3f} s" if empty is not None else "")
        b.add(key, f"6. `{label}` with {rows:,} old jobs", wall, "s", detail)
    for database in (db, small):  # something in the dead-letter queue, and a second queue
        b.enqueue_many(database, [{"id": f"dead-{i}", "command": "true", "queue": "other"} for i in range(3)])
        b.qc(database, "cancel", *[f"dead-{i}" for i in range(3)])
    bench_completion(b, db, small, rows)


# ---- backlog -----------------------------------------------------------------------------------

BACKLOG_QUEUE = "backfill"


def fill_backlog(b: Bench, db: str) -> int:
    """Enqueue work no worker may take: a big queue that is then paused (a backfill put on hold), and
    higher-priority jobs due in a day. Both are ones a priority-ordered claim index would walk past on
    every claim and poll. Through `enqueue -`, so every column is what queuectl itself writes. Returns
    the number of jobs, which must all still be pending at the end."""
    paused, later = b.p["backlog_paused"], b.p["backlog_later"]
    t = time.perf_counter()
    b.enqueue_many(db, [{"command": "true", "queue": BACKLOG_QUEUE}] * paused)
    # Paused after the enqueue, as a backlog that built up and was then put on hold: its jobs are due.
    b.qc(db, "pause", "--queue", BACKLOG_QUEUE)
    # Priority 5, above the measured jobs' 0: an index ordered by priority first puts all of them ahead.
    b.enqueue_many(db, [{"command": "true", "priority": 5, "delay": 86400}] * later)
    b.raw["backlog_fill_s"] = time.perf_counter() - t
    status = json.loads(b.qc(db, "status", "--json").stdout)
    if status["jobs"]["pending"] != paused + later or BACKLOG_QUEUE not in status.get("paused", []):
        raise BenchError(f"backlog: {status['jobs']['pending']} pending (expected {paused + later}), "
                         f"paused {status.get('paused')}")
    say(f"  enqueued {paused:,} jobs in paused {BACKLOG_QUEUE!r} + {later:,} due tomorrow "
        f"in {b.raw['backlog_fill_s']:.1f} s")
    return paused + later


def bench_backlog(b: Bench) -> None:
    paused, later, n = b.p["backlog_paused"], b.p["backlog_later"], b.p["jobs"]
    what = f"{paused:,} paused + {later:,} later jobs"
    if not b.batch_ok:  # one process per job would take hours at these sizes
        why = "`enqueue -` missing in this queuectl (one process per job would take hours)"
        for key, label, unit in (("backlog_idle_pct", f"8. idle cost with {what}", "%"),
                                 ("backlog_pickup_p50_ratio", "8. pickup p50, enqueue start → job start: "
                                  "empty / backlog", "x"),
                                 ("backlog_pickup_p95_ratio", "8. pickup p95, enqueue start → job start: "
                                  "empty / backlog", "x"),
                                 ("backlog_drain_ratio", "8. drain: backlog / empty", "x")):
            b.add(key, label, None, unit, why=why)
        return
    say(f"backlog: idle cost, pickup and drain beside {what}")
    db = b.new_db("backlog")
    backlog = fill_backlog(b, db)
    b.raw["backlog"] = {}

    # Idle first: nothing the worker may claim, so any CPU above the empty idle figure is the backlog's.
    idle = b.raw["backlog"]["idle"] = idle_cpu(b, db, "backlog", b.p["backlog_idle_seconds"])
    idle_figure(b, "backlog_idle_pct", f"8. idle cost with {what}", idle, "4 threads, % of one core")

    lat = b.raw["backlog"]["pickup_ms"] = pickup(b, db, "backlog")
    pickup_figures(b, lat, "backlog_pickup", "8. pickup p{p} with the backlog (from enqueue exit)",
                   "8. pickup p{p}, enqueue start → job start: empty / backlog", "with the backlog")

    # drain_once checks that exactly its own jobs completed and the pending count (the backlog) did not
    # move; the burst worker must exit by itself, the backlog being paused or not due within its horizon.
    drains = b.raw["backlog"]["drain"] = [drain_once(b, db, n, f"backlog{i}") for i in range(b.p["repeats"])]
    rate = statistics.median(d["rate"] for d in drains)
    b.add("backlog_drain_rate", f"8. drain with {what}", rate, "jobs/s", drain_figures(drains, n))
    drain_ratio_figure(b, "backlog_drain_ratio", "8. drain: backlog / empty", rate)

    left = b.counts(db)["pending"]
    if left != backlog:
        raise BenchError(f"backlog: {left} jobs pending at the end, {backlog} expected: paused or later jobs ran")


def bench_memory(b: Bench) -> None:
    n = b.p["memory_jobs"]
    say(f"memory: `worker start --count 8 --burst` draining {n} jobs")
    db = b.new_db("memory")
    # As installed (a copied `queuectl`, its cached bytecode), as the drains run; then `python3 queuectl.py`,
    # which compiles the file on every start and keeps the compiler's memory (about 20 MB, 2026-12-02).
    b.enqueue_many(db, [{"command": "true"}] * n)
    run = b.run_to_exit(db, "worker", "start", "--count", "8", "--burst", log="memory.log", timeout_s=120 + n / 20,
                        installed=True)
    b.enqueue_many(db, [{"command": "true"}] * n)
    compiled = b.run_to_exit(db, "worker", "start", "--count", "8", "--burst", log="memory-compiled.log",
                             timeout_s=120 + n / 20)
    b.raw["memory"] = {**run["last"], "peak_mb": run["peak_mb"], "samples": run["samples"],
                       "compiled_peak_mb": compiled["peak_mb"]}
    why = "" if run["peak_mb"] else (
        "the worker exited before /proc could be read" if not run["samples"] else
        f"/proc showed no memory figure (VmHWM) in {run['samples']} reads of the worker")
    also = f"{compiled['peak_mb']:.1f} MB" if compiled["peak_mb"] else "not read"
    b.add("memory_rss", "7. worker peak RSS, --count 8 (VmHWM)", run["peak_mb"], "MB",
          f"as installed, draining {n} jobs; {run['samples']} reads of /proc; up to "
          f"{run['last'].get('max_threads', '?')} OS threads; `python3 queuectl.py` (compiles): {also}",
          why=why)


# ==== Report =======================================================================================

def machine() -> dict:
    """What the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "cpu": model,
            "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}


def cpu_ticks() -> tuple[int, int, int, float]:
    """(busy, steal, total) clock ticks of the whole machine, and CPU seconds of this process and of its
    reaped children (the workers, with the jobs they reaped): to tell how much else ran meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0, 0, 0.0
    t = os.times()
    total = sum(fields)
    return total - fields[3] - fields[4], fields[7], total, t.user + t.system + t.children_user + t.children_system


def other_load(start: tuple, end: tuple) -> str:
    """Share of the machine's CPU that other processes (and the hypervisor's steal) took during the run."""
    busy, steal, total, ours = (b - a for a, b in zip(start, end))
    if total <= 0:
        return "unknown"
    other = max(0.0, busy - ours * CLK_TCK) / total * 100
    return f"{other:.0f} % of all cores (steal {steal / total * 100:.0f} %)"


def disk(path: str) -> str:
    try:
        out = subprocess.run(["df", "-hT", path], capture_output=True, text=True, timeout=10).stdout.splitlines()
        dev, fstype, size, _used, avail, _pct, mount = out[-1].split()[:7]
        return f"{fstype} on {dev} at {mount} ({size}, {avail} free)"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return "unknown"


def version() -> str:
    r = subprocess.run([PY, QUEUECTL, "--version"], capture_output=True, text=True, timeout=30)
    text = (r.stdout or r.stderr).strip()
    with open(QUEUECTL, "rb") as f:
        text += f", sha256 {hashlib.sha256(f.read()).hexdigest()[:12]}"
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "queuectl.py"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if QUEUECTL != os.path.join(ROOT, "queuectl.py"):
            text += f" ({QUEUECTL})"
        elif rev:
            text += f" (git {rev}{', queuectl.py modified' if dirty else ''})"
    except OSError:
        pass
    return text


def value_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["why"] == NO_SERVER:
        return NO_SERVER
    return NOT_MEASURED if r["why"] or r["value"] is None else UNITS[r["unit"]].format(r["value"])


def detail_cell(r: dict | None) -> str:
    """The detail, after why the figure was not measured (if it was not and there was a server)."""
    if r is None:
        return ""
    return "; ".join(x for x in (r["why"] if r["why"] != NO_SERVER else "", r["detail"]) if x)


def verdict_cell(r: dict | None) -> str:
    if r is None:
        return ""
    return {None: "", "pass": "pass", "fail": "**FAIL**"}.get(r["verdict"], r["verdict"])


def render(meta: dict, results: list[dict], notes: list[str]) -> str:
    """The report: a header, one table row per figure and a summary. A figure of the PostgreSQL column
    goes in the row of the SQLite figure with the same label (a row of its own if there is none), and
    the column is shown when the run has one. With meta["verdicts"] false (the tiny mode) the table has
    no result columns and the summary is NO_VERDICT, once."""
    verdicts = meta["verdicts"]
    lines = [f"queuectl benchmark, {meta['date']} — {meta['queuectl']}",
             f"machine: {meta['cores']} cores ({meta['cpu'] or 'unknown cpu'}), disk: {meta['disk']}, "
             f"Python {meta['python']}, SQLite {meta['sqlite']}",
             f"other processes during the run: {meta['other_load']} — a busy machine skews every figure, ratios least",
             f"mode: {meta['mode']}: " + ", ".join(f"{k}={v}" for k, v in meta["params"].items())]
    rows: dict[str, dict] = {}  # label -> {"sqlite": result, "postgresql": result}, in the order recorded
    for r in results:
        rows.setdefault(r["label"], {})[r.get("backend", "sqlite")] = r
    pg = any("postgresql" in row for row in rows.values())
    if pg:
        lines.append(f"PostgreSQL: {meta.get('postgresql', NO_SERVER)}")
    lines.append("")

    def cells(r: dict | None) -> list[str]:
        return [value_cell(r), r["target"] if r else ""] + ([verdict_cell(r)] if verdicts else [])

    head = ["figure", "SQLite" if pg else "value", "target"] + (["result"] if verdicts else [])
    if pg:
        head += ["PostgreSQL", "target"] + (["result"] if verdicts else [])
    head.append("detail")
    table = []
    for label, row in rows.items():
        sq, pq = row.get("sqlite"), row.get("postgresql")
        detail = detail_cell(sq)
        if pq and detail_cell(pq):
            detail += ("; " if detail else "") + "PostgreSQL: " + detail_cell(pq)
        table.append([label, *cells(sq), *(cells(pq) if pg else []), detail])
    widths = [max(len(x[i]) for x in [head, *table]) for i in range(len(head))]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    lines += [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, table)]
    if verdicts:
        judged = [r for r in results if r["verdict"] is not None]
        passed = sum(1 for r in judged if r["verdict"] == "pass")
        unmeasured = sum(1 for r in judged if r["verdict"] == NOT_MEASURED)
        line = (f"targets met: {passed} of {len(judged)}"
                + (f" ({unmeasured} not measured, so not met)" if unmeasured else ""))
        if pg:
            parts = []
            for backend, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
                mine = [r for r in judged if r.get("backend", "sqlite") == backend]
                parts.append(f"{name} {sum(1 for r in mine if r['verdict'] == 'pass')} of {len(mine)}")
            if any(r.get("backend") == "postgresql" and r["why"] == NO_SERVER for r in results):
                parts[-1] = "PostgreSQL not judged (no server)"
            line += ": " + ", ".join(parts)
        lines += ["", line]
    else:
        lines += ["", NO_VERDICT]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def verdicts_found(results: list[dict], report: str) -> list[str]:
    """What in a run without verdicts (the tiny mode) still judges: results with a verdict, table
    cells that read like one, a targets-met line. Empty when there is none."""
    found = [f"{r['label']}: {r['verdict']}" for r in results
             if r.get("verdict") is not None or r.get("pass") is not None]
    found += [f"table cell {m[0].strip()!r}" for m in VERDICT_CELL.finditer(report)]
    found += ["a 'targets met' line"] if "targets met" in report else []
    return found


# ==== Main =========================================================================================

def at_least_one(text: str) -> int:
    """argparse type: a count of at least 1 (an empty sample would have no figure)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def positive(text: str) -> float:
    """argparse type: a number of seconds or days above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be above zero: {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a few jobs each; for `make test` (finishes in seconds)")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    p.add_argument("--check", action="store_true", help="exit 1 if a target is missed or not measured")
    p.add_argument("--only", help=f"comma-separated sections to run (of {', '.join(SECTIONS)})")
    p.add_argument("--jobs", type=at_least_one, help="drain: jobs per run (default 2000)")
    p.add_argument("--repeats", type=at_least_one, help="drain: paired runs, the median is reported (default 5)")
    p.add_argument("--batch", type=at_least_one, help="batch enqueue: jobs (default 100000)")
    p.add_argument("--scale-rows", type=at_least_one, help="scale: finished jobs in the table (default 1000000)")
    p.add_argument("--scale-days", type=positive, help="scale: days the old jobs spread over (default 25)")
    p.add_argument("--backlog-paused", type=at_least_one, help="backlog: jobs in the paused queue (default 300000)")
    p.add_argument("--backlog-later", type=at_least_one, help="backlog: jobs due in a day (default 100000)")
    p.add_argument("--backlog-idle-seconds", type=positive,
                   help="backlog: seconds the idle cost is measured (default 10)")
    p.add_argument("--pickup-jobs", type=at_least_one, help="pickup: jobs (default 20)")
    p.add_argument("--idle-seconds", type=positive, help="idle: seconds measured (default 30)")
    p.add_argument("--memory-jobs", type=at_least_one, help="memory: jobs drained (default 500)")
    p.add_argument("--enqueue-runs", type=at_least_one, help="one-job enqueue: runs of each command (default 15)")
    p.add_argument("--parallel-jobs", type=at_least_one, help="parallel: `sleep 0.05` jobs per run (default 400)")
    p.add_argument("--parallel-repeats", type=at_least_one,
                   help="parallel: paired runs, the median is reported (default 3)")
    p.add_argument("--pg", metavar="URL", default=os.environ.get(PG_ENV, ""),
                   help=f"a PostgreSQL server, postgresql://USER@HOST:PORT/DB, to measure beside SQLite (default "
                        f"${PG_ENV}; '' for none). Each measurement makes its own schema there and drops it")
    p.add_argument("--seed", type=int, default=1, help="random seed (pickup intervals, ids)")
    p.add_argument("--tmpdir", help="where the temporary folder goes (default: $TMPDIR or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (databases and worker logs)")
    p.add_argument("--queuectl", help="the queuectl.py to measure (default: the one in this repository)")
    return p.parse_args(argv)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    global QUEUECTL
    args = parse_args(argv)
    if args.queuectl:
        QUEUECTL = os.path.abspath(args.queuectl)
    params = dict(TINY if args.tiny else FULL)
    for key in params:
        if getattr(args, key, None) is not None:
            params[key] = getattr(args, key)
    params["seed"] = args.seed
    sections = SECTIONS if not args.only else tuple(s.strip() for s in args.only.split(","))
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        print(f"bench: error: unknown section(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.tiny and args.check:
        print("bench: error: --check judges the targets, and --tiny gives no verdict", file=sys.stderr)
        return 2
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="queuectl-bench-", dir=args.tmpdir))
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "queuectl": version(),
            **machine(), "disk": disk(tmp), "mode": "tiny" if args.tiny else "full", "verdicts": not args.tiny,
            "params": {k: v for k, v in params.items() if k != "seed"}, "sections": list(sections)}
    b = Bench(params, tmp, verdicts=not args.tiny)
    b.sections = sections
    code = 0
    ticks = cpu_ticks()
    signal.signal(signal.SIGTERM, _interrupted)  # clean up the workers on `kill` too, not only on Ctrl+C
    try:
        if args.pg:
            b.use_pg(args.pg)
        b.probe_batch()
        b.probe_clock()
        for name in SECTIONS:
            if name in sections:
                globals()[f"bench_{name}"](b)
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        code = 130
    finally:
        b.cleanup()
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    meta["other_load"] = other_load(ticks, cpu_ticks())
    meta["postgresql"] = b.pg_info if not b.pg_why or b.pg_why == NO_SERVER else f"not measured: {b.pg_why}"
    if b.pg_errors:
        # A PostgreSQL measurement that failed: its figures read "not measured", and the run failed.
        for e in b.pg_errors:
            print(f"bench: error: PostgreSQL: {e}", file=sys.stderr)
        code = code or 1
    report = render(meta, b.results, b.notes)
    if args.json:
        print(json.dumps({"meta": meta, "results": b.results, "notes": b.notes, "raw": b.raw,
                          "error": code != 0}, indent=2))
    else:
        print(report)
    if args.tiny:
        # The tiny mode is a test that the benchmark runs: a verdict in it would be judged on a few jobs.
        found = verdicts_found(b.results, report)
        if found:
            print(f"bench: error: the tiny mode gave verdicts: {'; '.join(found)}", file=sys.stderr)
            return code or 1
    if code == 0 and args.check and any(r["verdict"] in ("fail", NOT_MEASURED) for r in b.results):
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
