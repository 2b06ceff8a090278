#!/usr/bin/env python3
"""End-to-end smoke test for queuectl: real worker processes against a temporary database.

Run `python3 smoke_test.py` (stdlib only; queuectl.py must sit next to this file). Prints one
`ok - ...` / `FAIL - ...` line per check and a summary, and exits 0 only if every check passed.
Every wait polls with a deadline: CI is a noisy 2-core machine, so nothing hopes it is fast.
"""
import collections
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
QUEUECTL = os.path.join(HERE, "queuectl.py")
DEADLINE_S = 60
POLL_S = 0.1

TMP = os.path.realpath(tempfile.mkdtemp(prefix="queuectl-smoke-"))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("QUEUECTL_")}
WORKERS: list[subprocess.Popen] = []
COUNTS = {"passed": 0, "failed": 0}


# ==== Helpers ==================================================================================

def check(name: str, ok: bool, detail: str = "") -> bool:
    """Print one result line (with indented detail on failure) and count it."""
    COUNTS["passed" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAIL'} - {name}")
    if not ok and detail:
        for line in str(detail).rstrip().splitlines()[-25:]:
            print(f"#   {line}")
    sys.stdout.flush()
    return ok


def q(db: str, *args: str) -> subprocess.CompletedProcess:
    """Run one queuectl CLI command against `db`; jobs enqueued here get cwd TMP."""
    return subprocess.run([sys.executable, QUEUECTL, "--db", db, *args], cwd=TMP, env=ENV,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)


def describe(r: subprocess.CompletedProcess) -> str:
    return f"$ {shlex.join(r.args[1:])}\nexit {r.returncode}\nstdout: {r.stdout!r}\nstderr: {r.stderr!r}"


def enqueue(db: str, **fields) -> str:
    r = q(db, "enqueue", json.dumps(fields))
    if r.returncode != 0:
        raise RuntimeError("enqueue failed\n" + describe(r))
    return r.stdout.strip()


def show(db: str, job_id: str) -> dict | None:
    """The job as `show --json` reports it, or None if the command failed."""
    r = q(db, "show", job_id, "--json")
    try:
        return json.loads(r.stdout) if r.returncode == 0 else None
    except ValueError:
        return None


def wait_for(predicate, timeout: float = DEADLINE_S):
    """Poll `predicate` until it returns something truthy or the deadline passes; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(POLL_S)


def wait_for_state(db: str, job_id: str, *states: str, timeout: float = DEADLINE_S) -> dict:
    """Poll the job until its state is one of `states`; return the last job object seen."""
    last: dict = {}

    def reached() -> bool:
        nonlocal last
        last = show(db, job_id) or last
        return last.get("state") in states

    wait_for(reached, timeout)
    return last


def start_worker(db: str, *args: str, name: str) -> subprocess.Popen:
    """Start `worker start ARGS` in its own session, logging to TMP/NAME.log."""
    log_path = os.path.join(TMP, f"{name}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, QUEUECTL, "--db", db, "worker", "start", *args],
                                cwd=TMP, env=ENV, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log_path
    WORKERS.append(proc)
    return proc


def wait_exit(proc: subprocess.Popen, timeout: float = DEADLINE_S) -> int | None:
    """The worker's exit code, or None if it is still running at the deadline."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def read_text(path: str) -> str:
    """The file's text, or "" if it does not exist."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def log_of(proc: subprocess.Popen) -> str:
    return read_text(proc.log_path)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live pid from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """True if a non-zombie process is in group `pgid` (PID 1 here does not reap orphans)."""
    for entry in os.listdir("/proc"):
        stat = proc_stat(int(entry)) if entry.isdigit() else None
        if stat and stat[1] == pgid and stat[0] != "Z":
            return True
    return False


def new_db(name: str) -> str:
    return os.path.join(TMP, f"{name}.db")


# ==== Scenarios ================================================================================

def test_job_completes() -> None:
    db = new_db("complete")
    job_id = enqueue(db, command="echo hello-from-job")
    worker = start_worker(db, "--burst", name="complete")
    rc = wait_exit(worker)
    job = show(db, job_id) or {}
    check("a job completes and the --burst worker exits 0",
          rc == 0 and job.get("state") == "completed" and job.get("attempts") == 0,
          f"worker exit {rc}\njob {job}\n{log_of(worker)}")
    r = q(db, "logs", job_id)
    check("logs prints the job's captured output",
          r.returncode == 0 and r.stdout == "hello-from-job\n", describe(r))


def test_retry_to_dlq_and_revive() -> None:
    db = new_db("dlq")
    flag = os.path.join(TMP, "dlq.flag")
    r = q(db, "config", "set", "backoff-base", "1")  # delay = 1 ** attempts = 1 s
    check("config set backoff-base 1", r.returncode == 0, describe(r))
    command = f"if [ -e {shlex.quote(flag)} ]; then exit 0; fi; exit 3"
    job_id = enqueue(db, command=command, max_retries=2)
    worker = start_worker(db, "--burst", name="dlq-1")
    rc = wait_exit(worker)
    job = show(db, job_id) or {}
    check("failing job (exit 3, max_retries 2) retries into the DLQ: dead, attempts 2",
          rc == 0 and job.get("state") == "dead" and job.get("attempts") == 2,
          f"worker exit {rc}\njob {job}\n{log_of(worker)}")
    check("dead job records exit_code 3", job.get("exit_code") == 3, f"job {job}")
    r = q(db, "dlq", "list", "--json")
    listed = [j.get("id") for j in json.loads(r.stdout)] if r.returncode == 0 else []
    check("dlq list --json shows the dead job", listed == [job_id], describe(r))

    open(flag, "w").close()  # the revived run succeeds
    r = q(db, "dlq", "retry", job_id)
    job = show(db, job_id) or {}
    check("dlq retry moves the job back to pending with attempts 0",
          r.returncode == 0 and job_id in r.stdout.split()
          and job.get("state") == "pending" and job.get("attempts") == 0,
          f"{describe(r)}\njob {job}")
    worker = start_worker(db, "--burst", name="dlq-2")
    rc = wait_exit(worker)
    job = show(db, job_id) or {}
    check("the revived job runs again and completes",
          rc == 0 and job.get("state") == "completed", f"worker exit {rc}\njob {job}\n{log_of(worker)}")


def test_many_workers_run_each_job_once() -> None:
    db = new_db("many")
    out = os.path.join(TMP, "many.out")
    ids = [f"job-{i:02d}" for i in range(60)]
    for job_id in ids:
        enqueue(db, id=job_id, command=f'echo "$QUEUECTL_JOB_ID" >> {shlex.quote(out)}')
    workers = [start_worker(db, "--count", "2", "--burst", name=f"many-{n}") for n in range(3)]
    wait_for(lambda: all(w.poll() is not None for w in workers))
    rcs = [w.poll() for w in workers]
    check("3 burst workers (--count 2) drain the queue and exit 0", rcs == [0, 0, 0],
          f"exit codes {rcs}\n" + "\n".join(log_of(w)[-1500:] for w in workers))
    runs = collections.Counter(read_text(out).split())
    extra = {k: v for k, v in runs.items() if v != 1 or k not in ids}
    missing = sorted(set(ids) - set(runs))
    check("each of 60 jobs ran exactly once", not extra and not missing,
          f"missing {missing}\nunexpected or repeated {extra}")
    r = q(db, "status", "--json")
    jobs = json.loads(r.stdout).get("jobs", {}) if r.returncode == 0 else {}
    check("status --json counts 60 completed and nothing else",
          jobs == {"pending": 0, "processing": 0, "completed": 60, "failed": 0, "dead": 0},
          describe(r))


def test_sigkilled_worker_job_is_recovered() -> None:
    db = new_db("kill")
    mark, pidfile = os.path.join(TMP, "kill.mark"), os.path.join(TMP, "kill.pid")
    # First run: record its process group ($$, the job has its own session), then hang.
    # Second run: sees the mark and succeeds at once.
    command = (f"if [ -e {shlex.quote(mark)} ]; then exit 0; fi; "
               f"echo $$ > {shlex.quote(pidfile)}; touch {shlex.quote(mark)}; sleep 60")
    job_id = enqueue(db, command=command)
    first = start_worker(db, name="kill-1")
    if not check("first worker starts the long job", wait_for(lambda: os.path.exists(mark)),
                 log_of(first)):
        return
    first.send_signal(signal.SIGKILL)
    first.wait(DEADLINE_S)
    with open(pidfile) as f:
        orphan_pgid = int(f.read())
    second = start_worker(db, "--burst", name="kill-2")
    job = wait_for_state(db, job_id, "completed", "dead")
    check("a later worker recovers the job of a SIGKILLed worker: completed, attempts 0",
          job.get("state") == "completed" and job.get("attempts") == 0,
          f"job {job}\n{log_of(second)}")
    check("the orphaned first run (sleep 60) no longer runs",
          wait_for(lambda: not group_alive(orphan_pgid), timeout=10),
          f"process group {orphan_pgid} still has live processes")
    rc = wait_exit(second)
    check("the recovering --burst worker exits 0", rc == 0, f"worker exit {rc}\n{log_of(second)}")


def test_sigterm_lets_running_job_finish() -> None:
    db = new_db("term")
    out = os.path.join(TMP, "term.out")
    worker = start_worker(db, name="term")
    job_id = enqueue(db, command=f"sleep 3; echo finished > {shlex.quote(out)}")
    job = wait_for_state(db, job_id, "processing", "completed")
    if not check("the job is processing before SIGTERM", job.get("state") == "processing",
                 f"job {job}\n{log_of(worker)}"):
        return
    finished_early = os.path.exists(out)
    worker.send_signal(signal.SIGTERM)
    rc = wait_exit(worker)
    job = show(db, job_id) or {}
    log = log_of(worker)
    check("worker exits 0 after SIGTERM and logged 'stopping'", rc == 0 and "stopping" in log,
          f"worker exit {rc}\n{log}")
    check("the running job finished after SIGTERM: file written, job completed",
          not finished_early and os.path.exists(out) and job.get("state") == "completed",
          f"finished before SIGTERM: {finished_early}\njob {job}\n{log}")


SCENARIOS = [test_job_completes, test_retry_to_dlq_and_revive, test_many_workers_run_each_job_once,
             test_sigkilled_worker_job_is_recovered, test_sigterm_lets_running_job_finish]


# ==== Runner ===================================================================================

def cleanup() -> None:
    """Kill leftover workers, then any process (job or orphan) whose cwd is inside TMP."""
    for proc in WORKERS:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for entry in os.listdir("/proc"):
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd") if entry.isdigit() else ""
            if cwd == TMP or cwd.startswith(TMP + os.sep):
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(TMP, ignore_errors=True)


def main() -> int:
    try:
        if not check(f"{QUEUECTL} exists", os.path.exists(QUEUECTL)):
            return 1
        for scenario in SCENARIOS:
            try:
                scenario()
            except Exception as exc:  # report and go on with the next scenario
                check(f"{scenario.__name__} ran without error", False, repr(exc))
        tracebacks = [w.log_path for w in WORKERS if "Traceback" in log_of(w)]
        check("no worker logged a traceback", not tracebacks, "\n".join(tracebacks))
    finally:
        cleanup()
        print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    return 0 if COUNTS["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
