#!/usr/bin/env python3
"""Deterministic simulation of queuectl's claim / heartbeat / sweep / finish / recover protocol.

The real `Store`, `Sweeper` and `Runner` run against a real SQLite file (on tmpfs when there is
one), driven from one thread by a seeded random scheduler with a fake clock: a monotonic clock that
the simulation advances, and a wall clock that follows it but sometimes steps (an NTP correction).
Several simulated worker processes, each with its own connection, registration and `Sweeper`, live
on different fake hosts, so every sweeper judges the others by their heartbeat lease, measured on
the simulated monotonic clock. Recovery is by adoption: a sweeper that drops a silent worker takes
over the runs it held in the same transaction (Store.drop_worker), or takes over an orphan, a
processing job whose worker row is gone (Store.adopt); it then kills the run's processes, keeps the
run (Sweeper.recovering) until they are gone, and requeues it as itself. queuectl's kill_run and
proc_start_time answer from fake processes (FakeProcs): an adopted orphan may have left some on the
sweeper's host, which take a while to exit once killed (the sweeper polls with time.sleep, and
simulated time passes), and a few cannot be killed (the job then goes dead). Each step is one of:

  tick / jump / wall step   advance the clocks a little, past a lease, or step the wall clock only
  database stall            a long write holds the database: the clocks advance and every live
                            worker's heartbeat commits that much late (Worker.stalled_s, which
                            its sweeper does not hold against anyone's lease)
  beat                      a worker's heartbeat; if its registration is gone it aborts the runs it
                            claimed under it and registers again (what `Worker` does)
  sweep                     `Sweeper.sweep(now)`, with queuectl's `time.monotonic` answering the
                            simulated clock; between any two of its transactions other steps may
                            interleave (time passes), and the sweeping process may die there (what
                            it kept in memory dies with it: it can only be replaced), or be stopped
                            there and later resume where it was; or one of its store calls fails
                            (Busy: the call never ran), ending the sweep, and the worker goes on
  claim / finish            `Store.claim`, then later `Store.finish` with a random outcome
  run                       `Runner.run_once(now)` with a fake command runner, other steps
                            interleaving while "the command runs", and the worker dying mid-run;
                            half the time it keeps claiming (`Store.finish_and_claim`) and the
                            slot's next run_once runs the job claimed with the result
  cancel poll               a worker kills the runs a user canceled (`Store.interrupt`; a cancel is
                            aimed at one run)
  crash / come back         a worker stops (no steps, no beats); later it resumes: runs that ended
                            meanwhile report their result with the claim they had, then it beats
  restart / stop            a crashed process is replaced by a new one; a worker stops (hard): it
                            requeues what its sweeper adopted (Sweeper.finish, within HARD_STOP_S)
                            and deregisters; a result it could not record, its row if it could not
                            deregister, and an adopted run it could not requeue are left to crash
                            recovery
  enqueue / cancel / retry  what users do (jobs with random retries, priorities, dependencies,
                            queues, and some with a run_at a few seconds ahead: staged until due);
                            a batch with a job on a dead dependency must be refused whole
  pause / resume            a user pauses or resumes queues ('*' = all); resuming one queue while
                            '*' is paused resumes it alone, until the next pause of it or of '*'

Each worker serves every queue or only some (`worker start --queue`), as its Runner and claims do.

After every step (interleaved ones included) the invariants are checked:
  - nothing lost or invented: the job rows are exactly the jobs enqueued; `Store.counts()` equals
    the rows; attempts <= max(max_retries, 1); lost_count <= 3; a processing job has exactly one
    open run, its own, and no other job has one; no run ends before it started;
  - every claim or adoption the model holds and nobody took away is the row's (worker, run) and
    vice versa, and the open run's worker is the one that started it (an adopter holds the job, the
    run stays its starter's); no job is held by two live owners (a worker is live while not crashed
    and its registration is current), nor adopted by two sweepers at once;
  - a claim (or an adoption) is taken away only by an adoption (drop_worker returning the run, or
    adopt returning its worker), and only after the registration it was made under was dropped;
    drop_worker adopts exactly the runs the dropped worker held (none if the adopter itself is not
    registered), and adopt succeeds exactly when the run is still its unregistered owner's and the
    adopter is registered (else the sweeper leaves it alone); a worker is dropped only after its
    heartbeat has not moved for more than stale-timeout of the monotonic clock (stall time excluded
    on top of that, the sweeper is only more conservative);
  - a write (finish or interrupt) is accepted exactly when its claim was not taken away (or the
    run was adopted back by a sweeper of its own worker id: the guard knows worker ids, not
    registrations; the write then ends that adoption); a sweeper's requeue (Store.interrupt as its
    own worker id) is accepted exactly when it holds its adoption of that run, and closes it: no
    sweeper requeues a job it did not adopt; Store.swept_jobs lists as adopted exactly the runs a sweeper holds
    by adoption and did not start itself;
  - an adopted orphan is requeued only after its run's processes were killed (after the adoption)
    and are gone, or one of them could not be killed and the job goes dead with that error;
  - a claim returns the first eligible job in claim order, and a job whenever one is eligible
    (eligible: waiting, no unfinished dependency, due, in a queue the worker serves and not paused:
    neither it nor '*' paused, or resumed alone since '*'); a claim made with a result
    (Store.finish_and_claim) likewise;
  - for each live worker's queues, `Store.due_now` is True exactly when a job is eligible for them
    or a staged job has fallen due in any queue (a claim promotes it: one spurious wake-up at most),
    and `Store.burst_done` is True exactly when nothing is processing in them and nothing waiting
    in them, unpaused, is due within the burst horizon;
  - once crashes and user actions stop, every queue is resumed and served, and time advances,
    every job becomes completed or dead (a crashed sweeper's adopted runs included: another
    sweeper drops it and adopts them).

The drain (the last phase: crashes and user actions stop) has the same steps, each still possible,
weighted by what the model says is useful: a worker beats when its beat is due, claims or runs when
a job is eligible for it, sweeps when a silent registration, an orphan or an adopted run is left;
and its clock goes straight to the next moment time brings something (a waiting job falls due, a
silent worker's lease runs out for a sweeper watching it, an adopted run's killed process is gone),
at most DRAIN_TICK_S at once. So it ends in some 20-25 steps, not 100+ of mostly idling; the
invariants are checked after each of them as before.

The checks read the database again only when something was committed since the last check
(PRAGMA data_version, plus total_changes of the checking connection): a step that wrote nothing
costs one PRAGMA, since every query would answer as it did. Store.counts() and the per-row rules
are checked again when a job row changed (a beat writes the workers table only), the open runs
whenever anything did, the poller's answers when a row, the paused queues, the live workers' queues
or the set of due jobs did; the checks against the model, which changes without a write (a crash,
an enqueue the model counts), run after every step regardless.

`run(seed, steps)` raises AssertionError naming the seed and step; `--seed N` reproduces it exactly
(add --trace to print every step). Without arguments: many seeds (`--seeds`, `--steps`) over
`--procs` processes; `--short` (2,000 seeds x 40 steps) is for `make test`.
The seeds reuse one database (tables emptied between seeds), which behaves as a fresh file would.
"""

import argparse
import bisect
import collections
import logging
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import queuectl as q  # noqa: E402

STALE_S = 10.0  # stale-timeout, seconds of the (simulated) monotonic clock
WALL_START = 1_700_000_000.0
POOL = 8  # connections opened once and reused by the simulated worker processes of every seed
BEAT_S = min(2.0, STALE_S / 5)  # a worker beats this often (as Worker._heartbeat)
DRAIN_TICK_S = STALE_S / 2  # the drain's clock steps at most this far at once: a live worker's lease survives it
PAST_EVENT_S = 0.01  # the drain's clock lands this far past an event (a lease runs out once *more* than
                    # stale-timeout has passed)
SHORT_SEEDS, SHORT_STEPS = 2000, 40  # --short, for `make test`
# A worker may be hard-stopped with any share of HARD_STOP_S left while a run its sweeper adopted is
# still exiting; a killed process takes at most TEARDOWN_MAX_S to be gone.
TEARDOWN_MAX_S = 4.0
DRAIN_STEPS = 30_000  # a seed whose jobs are not all terminal after this many drain steps fails
TERMINAL = (q.COMPLETED, q.DEAD)
WAITING = (q.PENDING, q.FAILED)
QUEUES = (q.DEFAULT_QUEUE, "a", "b")  # a seed uses the first 2 or 3
NO_JOBS_QUEUE = "c"  # a queue some workers serve but nobody enqueues into
SQL_ROWS = ("SELECT id, state, worker_id, run_count, attempts, max_retries, lost_count, waiting_on, "
            "priority, next_run_at, seq, last_error, queue, ready FROM jobs")
SQL_OPEN_RUNS = "SELECT job_id, run_no, worker_id FROM runs WHERE ended_at IS NULL"
# cancel_requested names the run a cancel was aimed at: the flag is whether it is the job's current run
SQL_INTERRUPTED = "SELECT state, lost_count, attempts, cancel_requested = run_count, last_error FROM jobs WHERE id = ?"
SQL_RUN_BACKWARDS = "SELECT job_id, run_no, started_at, ended_at FROM runs WHERE ended_at < started_at LIMIT 1"
SQL_DATA_VERSION = "PRAGMA data_version"  # changes when another connection commits
SQL_RUN_OUTCOME = "SELECT outcome, worker_id FROM runs WHERE job_id = ? AND run_no = ?"
SQL_DEAD_DEP = ("SELECT 1 FROM deps JOIN jobs d ON d.id = deps.dep_id WHERE deps.job_id = ? AND d.state = 'dead' "
                "LIMIT 1")
RESET = ["DELETE FROM runs", "DELETE FROM deps", "DELETE FROM jobs", "DELETE FROM workers", "DELETE FROM paused",
         "DELETE FROM config"]


class SimCrash(BaseException):
    """The simulated process dies here (BaseException: no `except Exception` in queuectl catches it)."""


class Violation(BaseException):
    """An invariant did not hold (BaseException, so that Runner._run's `except Exception` inside a
    simulated run cannot swallow it; run() turns it into an AssertionError)."""


class SimClock:
    """Stands in for the `time` module inside queuectl: monotonic() is the simulated clock, so the
    sweeper reads "its own monotonic clock" whenever its code chooses to, and sleep() lets that much
    simulated time pass (the sweeper polling for a killed run's processes to be gone); the rest is
    the real module."""

    def __init__(self, real):
        self.real, self.mono = real, 0.0
        self.slept = lambda seconds: None  # the simulation's wall clock follows

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.mono += seconds
        self.slept(seconds)

    def __getattr__(self, name):
        return getattr(self.real, name)


class FakeProcs:
    """A run's processes, as `kill_run` and `proc_start_time` see them (no real processes here).

    kill_run(token, left) finds the live processes carrying the token that were not sent SIGKILL
    yet, and the unkillable ones (their session is still led by the run's shell), records each in
    `left` and kills it: it is then gone once its teardown has taken its time on the simulated clock.
    A killed process still tearing down is not found by a later scan (its environment reads empty
    at once), as in queuectl. One that cannot be killed (a setuid helper) sets left.stuck and never
    goes. Every token asked for is recorded; an empty token (a worker of another host) finds nothing.
    """

    BASE = 1 << 23  # fake PIDs start above any real one (pid_max is at most 2**22)

    def __init__(self, clock: SimClock):
        self.clock = clock
        self.procs: dict[int, list] = {}  # pid -> [token, teardown_s, killed at (mono) or None, unkillable]
        self.killed_tokens: set[str] = set()

    def spawn(self, token: str, teardown_s: float, unkillable: bool = False) -> int:
        pid = self.BASE + len(self.procs)
        self.procs[pid] = [token, teardown_s, None, unkillable]
        return pid

    def end(self, pid: int) -> None:
        """The process exits now (a worker process dying)."""
        self.procs[pid][1:3] = [0.0, self.clock.mono]

    def alive(self, pid: int) -> bool:
        _, teardown_s, killed_at, unkillable = self.procs[pid]
        return unkillable or killed_at is None or self.clock.mono < killed_at + teardown_s

    def of(self, token: str) -> list[int]:
        """The live processes of this run."""
        return [pid for pid, p in self.procs.items() if p[0] == token and self.alive(pid)]

    def proc_start_time(self, pid: int, real=q.proc_start_time) -> str | None:
        if pid < self.BASE:
            return real(pid)
        return f"sim{pid}" if pid in self.procs and self.alive(pid) else None

    def kill_run(self, token: str, left: "q.Leftovers | None" = None) -> "q.Leftovers":
        left = q.Leftovers() if left is None else left
        if not token:
            return left
        self.killed_tokens.add(token)
        for pid in self.of(token):
            proc = self.procs[pid]
            if pid in left.killed or proc[2] is not None and not proc[3]:
                continue
            left.killed[pid] = f"sim{pid}"
            if proc[3]:
                left.stuck = left.stuck or f"cannot kill leftover process {pid} (sim): permission denied"
            else:
                proc[2] = self.clock.mono
        return left


class Patched:
    """Installs the simulation's clock and processes in queuectl (time, kill_run, proc_start_time)
    for the duration of a with block, and puts the real ones back."""

    def __init__(self, clock: SimClock, procs: FakeProcs):
        self.clock, self.procs = clock, procs

    def __enter__(self):
        self.saved = (q.time, q.kill_run, q.proc_start_time)
        q.time, q.kill_run, q.proc_start_time = self.clock, self.procs.kill_run, self.procs.proc_start_time
        return self

    def __exit__(self, *exc):
        q.time, q.kill_run, q.proc_start_time = self.saved


class Claim:
    """One run a worker believes it holds: the job as claimed, and the registration it was claimed
    under; or, with `adopted`, a run a sweeper took over to recover it (its worker's id is then the
    sweeper's, and `reg` the sweeper's registration at the adoption)."""

    def __init__(self, worker: "SimWorker", job: q.Job, reg: int, adopted: "Claim | None" = None,
                 token: str | None = None):
        self.worker, self.job, self.reg = worker, job, reg
        self.adopted = adopted  # the claim (or adoption) it was taken from, if an adoption
        self.starter = adopted.starter if adopted else worker.wid  # the worker that started the run
        self.token = token  # an adopted orphan's run token: its processes must be gone before the requeue
        self.revoked = False  # a sweeper adopted it (the write guard must now refuse this claim)
        self.closed = False  # its run was recorded by its worker, or abandoned with the process
        self.prefetched = False  # claimed in the same commit as the slot's last result

    def __repr__(self) -> str:
        return (f"{self.job.id}#{self.job.run_count}@{self.worker.wid}/reg{self.reg}"
                + (f" (adopted from {self.adopted.worker.wid})" if self.adopted else ""))


class HookedStore:
    """A worker's Store as its sweeper sees it: other steps may run before each call, or the process may die."""

    def __init__(self, sim: "Simulation", worker: "SimWorker"):
        self.sim, self.worker, self.store = sim, worker, worker.store

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def hooked(*args):
            self.sim.before_sweeper_call(self.worker)
            result = method(*args)
            self.sim.after_sweeper_call(self.worker, name, args, result)
            return result
        return hooked


class SimWorker:
    """A simulated worker process: a registration, N runner slots, a heartbeat and a Sweeper."""

    def __init__(self, sim: "Simulation", number: int, store: q.Store, slots: int, queues: tuple):
        self.sim, self.number, self.store = sim, number, store
        self.queues = queues  # `worker start --queue` names; () = every queue
        self.wid = f"simhost{number}:{1000 + number}:sim"
        self.me = {"host": f"simhost{number}", "pid": 1000 + number, "proc_start": "1", "boot_id": "sim-boot",
                   "pid_ns": f"pid:[sim{number}]"}
        self.stalled = 0.0  # how late its heartbeats were committed in all (Worker.stalled_s)
        self.sweeper = q.Sweeper(HookedStore(sim, self), self.me, self.wid, lambda: self.stalled)
        self.slots: list[Claim | None] = [None] * slots
        self.reg = 0  # registration number: bumped at each (re-)registration
        self.registered = False  # the model's belief: our current registration row exists
        self.last_beat = 0.0  # monotonic time of the last accepted beat or registration
        self.crashed = False
        self.dead = False  # died, not stopped: it never comes back, it can only be replaced
        self.exited = False
        self.inline: Claim | None = None  # the run in progress inside Runner.run_once

    def __repr__(self) -> str:
        return self.wid

    @property
    def up(self) -> bool:
        return not self.crashed and not self.exited

    def register(self) -> None:
        self.reg += 1
        self.store.register(self.wid, self.me, len(self.slots), self.sim.wall)
        self.registered, self.last_beat = True, self.sim.mono
        self.sim.trace(f"{self} registers (reg {self.reg}, queues {', '.join(self.queues) or 'all'})")

    def holds(self) -> list[Claim]:
        return [c for c in self.slots if c is not None]


class Simulation:
    """One seed's run: the model, the scheduler and the invariant checks."""

    def __init__(self, stores: list[q.Store], seed: int, steps: int, trace: bool = False):
        self.stores, self.seed, self.steps = stores, seed, steps
        self.rng = random.Random(seed)
        self.user = stores[0]
        self.clock = SimClock(time)  # installed as queuectl's `time` by run()
        self.wall = WALL_START
        self.step_no, self.depth, self.active = 0, 0, True
        self.waited = 0.0  # how long the current sweep polled for killed processes to be gone
        self.busy_main: set = set()  # workers whose main loop is mid-operation (a sweep)
        self.workers: list[SimWorker] = []
        self.claims: dict[str, list[Claim]] = {}  # job id -> every claim made on it
        self.jobs: set[str] = set()
        self.next_job = 0
        self.queues: tuple = ()  # the queues jobs go to this seed (chosen in run)
        # The model of pausing: every queue paused ('*'), the queues paused by name, and those resumed
        # alone while every queue is paused.
        self.paused_all = False
        self.paused: set[str] = set()
        self.resumed: set[str] = set()
        self.polled: tuple | None = None  # what check_polls last checked (see there)
        self.due_times: tuple = (None, [])  # (rows, their sorted next_run_at) for check_polls
        self.procs = FakeProcs(self.clock)  # installed as queuectl's kill_run and proc_start_time by run()
        self.clock.slept = self.slept
        self._rows: dict[str, tuple] = {}  # the job rows by id as last read (the same dict while unchanged)
        self.rows_stale = True  # something may have been written since they were read
        self.version: tuple | None = None  # the database's version when the invariants were last checked
        self.audited: dict | None = None  # the rows the per-row rules were last checked on
        self.held: dict = {}  # job id -> (run, worker) of their processing jobs
        self.open_runs: dict = {}  # job id -> (run, worker that started it) of their open runs
        self.open: dict[str, list[Claim]] = {}  # job id -> claims not closed yet
        self.log: collections.deque = collections.deque(maxlen=25)  # the last steps, for a failure's message
        self.print_trace = trace
        self.stats = dict.fromkeys(("claims", "finishes", "rejected", "revoked", "drops", "adopted orphans",
                                    "requeues", "readopted", "leftovers", "stuck", "stalls", "crashes",
                                    "comebacks", "runs", "sweeps", "prefetched", "scheduled", "pauses"), 0)

    @property
    def mono(self) -> float:
        return self.clock.mono

    @mono.setter
    def mono(self, value: float) -> None:
        self.clock.mono = value

    # -- plumbing -------------------------------------------------------------------------------

    def trace(self, text: str) -> None:
        line = f"[{self.step_no}{'.' * self.depth} t={self.mono:.2f}] {text}"
        if self.print_trace:
            print(line)
        self.log.append(line)

    def fail(self, message: str) -> None:
        raise Violation(f"seed {self.seed}, step {self.step_no}: {message}\n  last steps:\n    "
                        + "\n    ".join(self.log))

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(message)

    def spawn(self, queues: tuple | None = None) -> SimWorker:
        number = len(self.workers)
        slots = self.rng.randint(1, 3)
        queues = self.pick_queues() if queues is None else queues
        w = SimWorker(self, number, self.stores[1 + number % (len(self.stores) - 1)], slots, queues)
        self.workers.append(w)
        w.register()
        return w

    def pick_queues(self) -> tuple:
        """Half the workers serve every queue; the others some, in any order, now and then with one
        that never gets a job (its head is empty: the claim must look past it)."""
        if self.rng.random() < 0.5:
            return ()
        names = self.rng.sample(self.queues, self.rng.randint(1, len(self.queues)))
        if self.rng.random() < 0.15:
            names.insert(self.rng.randint(0, len(names)), NO_JOBS_QUEUE)
        return tuple(names)

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> None:
        for key, value in (("stale_timeout", STALE_S), ("backoff_base", 2), ("backoff_max", 8)):
            self.user.config_set(key, value)
        self.queues = QUEUES[:self.rng.randint(2, 3)]
        for _ in range(self.rng.randint(2, 4)):
            self.spawn()
        self.enqueue(self.rng.randint(2, 6))
        self.check_invariants()
        for self.step_no in range(1, self.steps + 1):
            self.step()
            self.check_invariants()
        self.drain()

    def drain(self) -> None:
        """Crashes, clock steps and users stop; time advances; every job must become terminal."""
        self.active = False
        self.trace("drain: crashes and user actions stop; every queue is resumed")
        self.user.resume([])
        self.paused_all, self.paused, self.resumed = False, set(), set()
        for _ in range(DRAIN_STEPS):
            if not self.all_served():  # a queue nobody up serves would never drain
                self.spawn(())
            if self.all_terminal():
                return
            self.step_no += 1
            self.step()
            self.check_invariants()
        left = {i: r[1] for i, r in self.rows().items() if r[1] not in TERMINAL}
        self.fail(f"liveness: after {DRAIN_STEPS} drain steps these jobs are not terminal: {left}")

    def all_served(self) -> bool:
        served = set()
        for w in self.workers:
            if w.up:
                served.update(w.queues or self.queues)
        return served >= set(self.queues)

    def all_terminal(self) -> bool:
        return all(r[1] in TERMINAL for r in self.rows().values()) and not any(
            w.holds() for w in self.workers if w.up)

    def step(self) -> None:
        choices = self.candidates()
        pick = self.rng.random() * sum([choice[0] for choice in choices])
        for choice in choices:
            pick -= choice[0]
            if pick < 0:
                break
        choice[1](*choice[2:])

    def candidates(self) -> list:
        """(weight, method, *arguments) of every step possible now; nested steps leave busy actors alone.

        The drain has the same steps (but crashes, stops and user actions), each still possible,
        weighted by what the model says is useful now: the clock moves when something waits for
        time (then straight to it), a worker beats when its beat is due (every BEAT_S, as
        Worker does), sweeps when a silent registration or an orphan is left, claims or runs
        when a job is eligible for it; the rest keeps a small weight. A liveness check needs a
        purposeful scheduler, not one that mostly idles (the active steps cover idling).
        """
        active = self.active
        up = [w for w in self.workers if w.up]
        if active:
            c: list = [(10, self.short_tick), (1, self.long_tick), (0.5, self.wall_step), (0.3, self.db_stall),
                       (2, self.user_enqueue), (1, self.user_cancel), (1, self.user_retry), (0.5, self.user_pause),
                       (1, self.user_resume)]
        else:
            rows = self.rows()
            c = [(10 if self.until_next_event() is not None else 0.5, self.drain_tick)]
            lingering = any(w.registered and not w.up for w in self.workers) or any(
                not k.revoked and not k.worker.registered for claims in self.open.values() for k in claims) or any(
                w.sweeper.recovering for w in up)
        for w in up:
            if w in self.busy_main:
                continue
            if active:
                c += [(4, self.beat, w), (2, self.sweep, w), (0.5, self.cancel_poll, w)]
                if not w.inline:
                    c += [(0.6, self.crash, w), (0.2, self.hard_stop, w)]
            else:
                beat_due = not w.registered or self.mono - w.last_beat >= BEAT_S
                c += [(4 if beat_due else 0.3, self.beat, w), (2 if lingering else 0.3, self.sweep, w),
                      (0.2, self.cancel_poll, w)]
        for w in up:
            work = 3 if active or any(self.eligible_rows(rows, w.queues, self.wall)) else 0.3
            for i, claim in enumerate(w.slots):
                if claim is None:
                    c.append((work, self.claim, w, i))
                elif claim is not w.inline:  # the inline run ends inside run_once
                    c.append((3, self.finish, w, i))
                    if claim.reg != w.reg:
                        c.append((6, self.abort_stale, w, i))
            if not w.inline and self.depth == 0:
                for i, claim in enumerate(w.slots):
                    if claim is None or claim.prefetched:
                        c.append((1.5 if active or claim else work / 2, self.run_once, w, i))
        for w in self.workers:
            if w.crashed and w not in self.busy_main:
                c += [] if w.dead else [(1.5 if active else 0.5, self.come_back, w)]
                c.append((0.3, self.restart, w))
        return c

    # -- clocks -------------------------------------------------------------------------------------

    def tick(self, dt: float) -> None:
        self.mono += dt
        self.wall += dt
        self.trace(f"tick {dt:.2f}s")

    def short_tick(self) -> None:
        self.tick(self.rng.expovariate(1 / 0.3))

    def long_tick(self) -> None:
        """Past a lease, or not quite."""
        self.tick(self.rng.uniform(STALE_S * 0.5, STALE_S * 2))

    def drain_tick(self) -> None:
        """The drain only waits for time to bring something: straight to the next such moment (a
        waiting job falls due; a silent worker's lease runs out for a sweeper that watches it), at
        most DRAIN_TICK_S, which a live worker's lease outlasts (it beats between ticks)."""
        dt = self.until_next_event()
        self.tick(self.rng.expovariate(1 / 0.3) if dt is None else min(dt, DRAIN_TICK_S))

    def until_next_event(self) -> float | None:
        """Seconds until time alone changes what may happen next, or None if nothing is waiting for time."""
        wall, mono = self.wall, self.mono
        soonest = min((r[9] - wall for r in self.rows().values() if r[1] in WAITING and r[7] == 0 and r[9] > wall),
                      default=None)
        for w in self.workers:
            if not w.up:
                continue
            for (wid, _), (_, since, stalled_then, lease_s, _) in w.sweeper.seen.items():
                left = since + max(STALE_S, lease_s) + (w.stalled - stalled_then) - mono
                if left >= 0 and (soonest is None or left < soonest) and not self.worker_by_id(wid).up:
                    soonest = left
            for token, leftovers in w.sweeper.recovering.values():  # an adopted run's processes finish exiting
                for pid in leftovers.killed:
                    _, teardown_s, killed_at, unkillable = self.procs.procs[pid]
                    left = (killed_at or mono) + teardown_s - mono
                    if not unkillable and left >= 0 and (soonest is None or left < soonest):
                        soonest = left
        return None if soonest is None else soonest + PAST_EVENT_S

    def db_stall(self) -> None:
        """A long write (a huge enqueue, a purge) holds the database: nobody can beat meanwhile, and
        each live worker's heartbeat commits that much late, which its sweeper then does not hold
        against anyone's lease (Worker.stalled_s)."""
        stall = self.rng.uniform(1, STALE_S)
        self.mono += stall
        self.wall += stall
        for w in self.workers:
            if w.up:
                w.stalled += stall
        self.stats["stalls"] += 1
        self.trace(f"the database is held for {stall:.2f}s: every live worker's heartbeat is that late")

    def slept(self, seconds: float) -> None:
        """A sweeper polled (time.sleep) for an adopted run's killed processes to be gone: time passes."""
        self.wall += seconds
        self.waited += seconds

    def wall_step(self) -> None:
        step = self.rng.choice((-1, 1)) * self.rng.uniform(1, 60)
        self.wall += step
        self.trace(f"wall clock steps {step:+.1f}s (monotonic unchanged)")

    # -- users ----------------------------------------------------------------------------------------

    def user_enqueue(self) -> None:
        self.enqueue(self.rng.randint(1, 3))

    def enqueue(self, n: int) -> None:
        defaults = self.user.config_all()
        specs = []
        for _ in range(n):
            job_id = f"j{self.next_job}"
            self.next_job += 1
            obj = {"id": job_id, "command": "true", "max_retries": self.rng.choice((0, 1, 2, 3, 4)),
                   "priority": self.rng.choice((0, 0, 0, 1, -1))}
            queue = self.rng.choice(self.queues)
            if queue != q.DEFAULT_QUEUE:  # the default one by omission, as most users would
                obj["queue"] = queue
            self.schedule(obj)
            earlier = sorted(self.jobs) + [s["id"] for s in specs]
            if earlier and self.rng.random() < 0.15:
                obj["depends_on"] = [self.rng.choice(earlier)]
            specs.append(q.validate_job(obj, defaults, "/", self.wall))
        dead = {i for i, r in self.rows().items() if r[1] == q.DEAD}
        refused = next((s for s in specs if dead & set(s["depends_on"])), None)
        if refused is not None:
            self.refused_on_dead_dependency(specs, refused)
            specs = [{**s, "depends_on": [d for d in s["depends_on"] if d not in dead]} for s in specs]
        self.user.enqueue(specs, self.wall)
        self.jobs.update(s["id"] for s in specs)
        self.trace("enqueue " + ", ".join(self.describe(s) for s in specs))

    def refused_on_dead_dependency(self, specs: list[dict], first: dict) -> None:
        """A batch with a job on a dead dependency is refused whole, naming the first such job."""
        before = self.user.read(SQL_ROWS)
        try:
            self.user.enqueue(specs, self.wall)
        except q.Conflict as e:
            self.check(f"job {first['id']!r} depends on" in str(e) and "dead" in str(e), f"enqueue refused for "
                       f"another reason than {first['id']}'s dead dependency: {e}")
            self.trace(f"enqueue {', '.join(s['id'] for s in specs)} refused: {e}")
        else:
            self.fail(f"enqueue of {first['id']} on the dead {first['depends_on'][0]} was accepted")
        self.check(self.user.read(SQL_ROWS) == before, "a refused enqueue changed the jobs")

    def schedule(self, obj: dict) -> None:
        """Some jobs are for later (staged until a claim promotes them), a few for a moment already
        past (due at once, ahead in claim order of jobs enqueued earlier)."""
        roll = self.rng.random()
        if roll < 0.2:
            obj["run_at"] = self.wall + self.rng.uniform(0.5, 5)
            self.stats["scheduled"] += 1
        elif roll < 0.25:
            obj["delay"] = self.rng.uniform(0.5, 5)
            self.stats["scheduled"] += 1
        elif roll < 0.3:
            obj["run_at"] = self.wall - self.rng.uniform(0, 3)

    def describe(self, spec: dict) -> str:
        text = spec["id"] + (f":{spec['queue']}" if spec["queue"] != q.DEFAULT_QUEUE else "")
        if spec["priority"]:
            text += f" p{spec['priority']:+d}"
        if spec["run_at"] is not None:
            text += f" at {spec['run_at'] - self.wall:+.2f}s"
        return text + ("<-" + spec["depends_on"][0] if spec["depends_on"] else "")

    def user_cancel(self) -> None:
        open_jobs = sorted(i for i, r in self.rows().items() if r[1] not in TERMINAL)
        if open_jobs:
            job_id = self.rng.choice(open_jobs)
            self.user.cancel([job_id], self.wall)
            self.trace(f"user cancels {job_id}")

    def user_retry(self) -> None:
        dead = sorted(i for i, r in self.rows().items() if r[1] == q.DEAD)
        if not dead:
            return
        job_id = self.rng.choice(dead)
        try:
            self.user.retry_dead([job_id], self.wall)
            self.trace(f"user retries {job_id}")
        except q.Conflict as e:
            self.check(bool(self.user.read(SQL_DEAD_DEP, (job_id,))), f"dlq retry {job_id} refused wrongly: {e}")
            self.trace(f"user retry of {job_id} refused: {e}")

    def user_pause(self) -> None:
        names = ["*"] if self.rng.random() < 0.15 else self.rng.sample(self.queues, self.rng.randint(1, 2))
        self.user.pause(names)
        if names == ["*"]:
            self.paused_all, self.paused, self.resumed = True, set(), set()
        elif self.paused_all:
            self.resumed -= set(names)
        else:
            self.paused |= set(names)
        self.stats["pauses"] += 1
        self.trace(f"user pauses {', '.join(names)}")
        self.check_paused()

    def user_resume(self) -> None:
        """Resume everything, or one queue (while '*' is paused: that queue alone)."""
        if not (self.paused or self.paused_all):
            return
        names = [] if self.rng.random() < 0.5 else [self.rng.choice(self.queues)]
        self.user.resume(names)
        if not names:
            self.paused_all, self.paused, self.resumed = False, set(), set()
        elif self.paused_all:
            self.resumed |= set(names)
        else:
            self.paused -= set(names)
        self.trace(f"user resumes {', '.join(names) or 'all queues'}")
        self.check_paused()

    def check_paused(self) -> None:
        rows = set(self.user.paused())
        expected = {"*"} | {"!" + name for name in self.resumed} if self.paused_all else self.paused
        self.check(rows == expected, f"Store.paused() {sorted(rows)}, the model says {self.paused_text()}")

    def is_paused(self, queue: str) -> bool:
        return queue not in self.resumed and (self.paused_all or queue in self.paused)

    def paused_text(self) -> str:
        if self.paused_all:
            return "all" + (f" but {sorted(self.resumed)}" if self.resumed else "")
        return str(sorted(self.paused))

    # -- worker main loop: heartbeat, sweep, cancel poll ---------------------------------------------

    def beat(self, w: SimWorker) -> None:
        result = w.store.heartbeat(w.wid, self.wall)
        self.check((result is None) == (not w.registered),
                   f"{w} heartbeat returned {result} but the model says registered={w.registered}")
        if result is not None:
            w.last_beat = self.mono
            self.trace(f"{w} beats")
            return
        # As Worker._on_lost_registration: a new registration number, then register again. Its threads
        # notice the new number later (within 250 ms) and abort the runs claimed under the old one: the
        # `abort` step. Meanwhile its other threads may claim, and a run may finish first.
        self.trace(f"{w} finds its registration gone: registers again; runs of the old one will abort")
        w.register()

    def abort_stale(self, w: SimWorker, slot: int) -> None:
        """A thread notices its run was claimed under an older registration and kills it."""
        self.record(w, slot, q.Outcome(None, "worker lost its registration", b"", 0.0,
                                       interrupted="worker lost its registration"))

    def sweep(self, w: SimWorker) -> None:
        self.stats["sweeps"] += 1
        self.trace(f"{w} sweeps")
        self.busy_main.add(w)
        self.waited = 0.0
        try:
            n = w.sweeper.sweep(self.wall)  # its monotonic clock is the simulation's (SimClock)
            waited = f" (waited {self.waited:.2f}s for killed processes)" if self.waited else ""
            pending = f", {len(w.sweeper.recovering)} adopted run(s) still exiting" if w.sweeper.recovering else ""
            self.trace(f"{w} swept: {n} recovered{pending}{waited}")
        except SimCrash:
            self.trace(f"{w} dies in the middle of its sweep")
            self.mark_crashed(w)
            w.dead = True  # what it held in memory (Sweeper.recovering) died with it
        except q.Busy as e:
            self.trace(f"{w}'s sweep fails ({e}); its main loop goes on, as Worker._loop does")
        finally:
            self.busy_main.discard(w)

    def before_sweeper_call(self, w: SimWorker) -> None:
        """Before each of the sweeper's transactions: other processes may act (time passes), or the
        sweeping process dies, or it is stopped (SIGSTOP, a frozen VM) and later resumes right here."""
        if self.depth or not self.active:
            return
        roll = self.rng.random()
        if roll < 0.015:
            raise SimCrash()
        if roll < 0.03:
            self.trace(f"{w} is stopped in the middle of its sweep")
            self.mark_crashed(w)
            self.nested(self.rng.randint(1, 6))
            w.crashed = False
            self.stats["comebacks"] += 1
            self.trace(f"{w} resumes its sweep")
        elif roll < 0.3:
            self.nested(self.rng.randint(1, 4))
        elif roll < 0.32:
            raise q.Busy("database is busy (simulated: the call never ran)")

    def after_sweeper_call(self, w: SimWorker, name: str, args: tuple, result) -> None:
        if name == "drop_worker" and result is not None:  # dropped, and the jobs it held adopted
            self.on_dropped(args[0], w, args[3], result)
        elif name == "adopt":
            self.on_adopt(w, *args, result)
        elif name == "swept_jobs":  # [1]: the runs it adopted and has not requeued (one whose requeue failed)
            expected = sorted((c.job.id, c.job.run_count, c.starter) for c in self.holders()
                              if c.worker is w and c.adopted and c.starter != w.wid)
            self.check(sorted(map(tuple, result[1])) == expected,
                       f"{w}: Store.swept_jobs() says adopted {sorted(result[1])}, the model {expected}")
        elif name == "interrupt":
            self.on_requeue(w, args, result)

    def on_dropped(self, wid: str, by: SimWorker, adopter: str, adopted: list) -> None:
        victim = self.worker_by_id(wid)
        self.stats["drops"] += 1
        silent = self.mono - victim.last_beat
        self.trace(f"{by} drops {victim} (no beat for {silent:.2f}s)")
        self.check(victim.registered, f"{by} dropped {victim}, which the model says is not registered")
        self.check(silent > STALE_S, f"{by} dropped {victim} whose last beat was only {silent:.2f}s ago "
                                     f"(stale-timeout {STALE_S:g}s of the monotonic clock)")
        self.check(adopter == by.wid, f"{by} dropped {victim} for adopter {adopter}")
        victim.registered = False
        # Every run the victim held (claimed, or adopted by its sweeper) is adopted in the same
        # transaction, unless the adopter's own registration is gone: then they stay orphans.
        held = sorted((c.job.id, c.job.run_count) for c in self.holders() if c.worker is victim)
        got = sorted((job_id, run_no) for job_id, run_no, _ in adopted)
        self.check(got == (held if by.registered else []),
                   f"{by} dropped {victim} and adopted {got}; {victim} held {held}"
                   + ("" if by.registered else f", and {by} is not registered (it may adopt none)"))
        for job_id, run_no, run_worker in adopted:
            self.on_adopted(by, job_id, run_no, run_worker, None)

    def on_adopt(self, by: SimWorker, job_id: str, run_no: int, owner: str, adopter: str, result) -> None:
        """Store.adopt of an orphan: it must succeed exactly when the run is still the owner's, the
        owner is not registered and the adopter is (else someone adopted it first: leave it alone)."""
        self.check(adopter == by.wid, f"{by} adopts {job_id} for {adopter}")
        holder, owner_w = self.holder(job_id), self.worker_by_id(owner)
        can = (by.registered and not owner_w.registered and holder is not None and holder.worker is owner_w
               and holder.job.run_count == run_no)
        self.check((result is not None) == can,
                   f"{by} adopt({job_id}#{run_no} of {owner}) returned {result!r}, but {holder or 'nobody'} holds it "
                   f"({owner} registered: {owner_w.registered}, {by} registered: {by.registered})")
        if result is None:
            self.trace(f"{by} leaves {job_id}#{run_no} alone: {holder or 'nobody'} holds it")
            return
        self.on_adopted(by, job_id, run_no, result, f"{result}/{run_no}/{job_id}")

    def on_adopted(self, by: SimWorker, job_id: str, run_no: int, run_worker: str, token: str | None) -> None:
        """The claim (or an earlier adoption) is taken away: from now on the job is `by`'s alone."""
        prev = self.holder(job_id)
        self.check(prev is not None and prev.job.run_count == run_no,
                   f"{by} adopted {job_id}#{run_no}, which {prev or 'nobody'} holds")
        w = prev.worker
        self.check(not (w.registered and prev.reg == w.reg),
                   f"{by} took {prev} away from {w}, whose registration {prev.reg} was never dropped "
                   f"(the worker is live: last beat {self.mono - w.last_beat:.2f}s ago)")
        self.check(by.registered, f"{by} adopted {prev} without a registration")
        self.check(run_worker == prev.starter, f"{by} adopted {prev}: the store says its run was started by "
                                               f"{run_worker}, the model by {prev.starter}")
        others = [c for c in self.open[job_id] if c.adopted and not c.revoked and c is not prev]
        self.check(not others, f"{by} adopted {prev} while {others} hold it too: two adopters at once")
        prev.revoked = True
        claim = Claim(by, prev.job, by.reg, adopted=prev, token=token)
        self.claims[job_id].append(claim)
        self.open[job_id].append(claim)
        self.stats["revoked"] += 1
        if token:  # an orphan: its run may have left processes on this host, and they are killed from now on
            self.stats["adopted orphans"] += 1
            self.procs.killed_tokens.discard(token)
            if self.active and not any(p[0] == token for p in self.procs.procs.values()) and self.rng.random() < 0.3:
                for _ in range(self.rng.randint(1, 2)):
                    teardown_s = min(self.rng.expovariate(1 / 0.4), TEARDOWN_MAX_S)
                    self.procs.spawn(token, teardown_s, unkillable=self.rng.random() < 0.1)
                    self.stats["leftovers"] += 1
        self.trace(f"{by} adopts {claim}{' (orphan)' if token else ''}")

    def on_requeue(self, by: SimWorker, args: tuple, result) -> None:
        """Sweeper._requeue's Store.interrupt, as the sweeper's own worker id: accepted exactly when
        the sweeper still holds its adoption of the run, which it then closes."""
        job, owner, lost, stuck = args[0], args[1], args[3], (args[5] if len(args) > 5 else None)
        self.check(owner == by.wid and lost, f"{by} requeued {job.id} as {owner} (lost {lost}), not as itself")
        mine = [c for c in self.open.get(job.id, []) if c.worker is by and c.adopted
                and c.job.run_count == job.run_count]
        current = [c for c in mine if not c.revoked]
        if result is None:
            self.check(not current, f"{by}'s requeue of its adoption {current} was rejected")
            self.trace(f"{by}'s requeue of {job.id}#{job.run_count} rejected: it does not hold it (any more)")
        else:
            self.check(bool(current), f"{by} requeued {job.id}#{job.run_count}, which it did not adopt "
                                      f"(or whose adoption was taken away): {self.open.get(job.id)}")
            claim = current[0]
            self.stats["requeues"] += 1
            self.trace(f"{by} requeues {claim} -> {result}{f' ({stuck})' if stuck else ''}")
            if claim.token is not None:  # an orphan: its leftovers are killed, and gone, before the requeue
                self.check(claim.token in self.procs.killed_tokens,
                           f"{by} requeued orphan {claim} without killing its run's processes first")
                alive = self.procs.of(claim.token)  # all gone; or one cannot be killed, and the job goes dead
                self.check(not alive or stuck and any(self.procs.procs[p][3] for p in alive),
                           f"{by} requeued orphan {claim} while its run's processes {alive} are not gone")
            self.check(not stuck or claim.token is not None, f"{by} found {claim} stuck without a token")
            self.stats["stuck"] += bool(stuck)
            self.check_interrupt_rule(claim, result, lost=True, stuck=stuck)
        for claim in mine:
            self.close(claim)

    def cancel_poll(self, w: SimWorker) -> None:
        asked = w.store.cancel_requests(w.wid)
        for i, claim in enumerate(w.slots):
            if claim is not None and claim is not w.inline and (claim.job.id, claim.job.run_count) in asked:
                self.trace(f"{w} kills canceled {claim}")
                self.record(w, i, q.Outcome(None, "canceled", b"", 0.1, interrupted="canceled"))

    # -- worker threads: claim, finish, run_once ------------------------------------------------------

    def claim(self, w: SimWorker, slot: int) -> None:
        self.rows()  # as they were before the claim
        job = w.store.claim(w.wid, self.wall, w.queues)
        self.on_claimed(w, job)
        if job is not None:
            w.slots[slot] = self.claims[job.id][-1]

    def claimable(self, queue: str, queues: tuple) -> bool:
        """May a worker serving `queues` (() = all) claim from `queue` now?"""
        return (not queues or queue in queues) and not self.is_paused(queue)

    def eligible_rows(self, rows: dict, queues: tuple, now: float):
        """The jobs a worker serving `queues` may claim at `now`, in no order."""
        return (r for r in rows.values() if r[1] in WAITING and r[7] == 0 and r[9] <= now
                and self.claimable(r[12], queues))

    def eligible(self, rows: dict, queues: tuple, now: float) -> list:
        """The jobs a worker serving `queues` may claim at `now`, in claim order."""
        return sorted(self.eligible_rows(rows, queues, now),
                      key=lambda r: (-r[8], r[9], r[10]))  # priority DESC, next_run_at, seq

    def on_claimed(self, w: SimWorker, job: q.Job | None, rows: dict | None = None, now: float | None = None,
                   prefetched: bool = False) -> Claim | None:
        """Check a claim made at `now` (default: the wall clock) against the rows as they were just
        before it (default: the cached ones), and record it."""
        rows = self.rows() if rows is None else rows
        eligible = self.eligible(rows, w.queues, self.wall if now is None else now)
        if not w.registered:
            self.check(job is None, f"{w} claimed {job and job.id} without a registration")
            self.trace(f"{w} claim refused (not registered)")
            return None
        first = eligible[0][0] if eligible else None
        if job is None:
            self.check(first is None, f"{w} claimed nothing although {first} is eligible")
            return None
        self.check(job.state == q.PROCESSING and job.worker_id == w.wid, f"claim returned {job!r}")
        self.check(job.id == first, f"{w} (queues {w.queues or 'all'}, paused {self.paused_text()}) claimed "
                                    f"{job.id} from {job.queue}; the first eligible job in claim order is {first}")
        self.check(job.run_count == rows[job.id][3] + 1, f"claim returned {job!r}")
        for other in self.open.get(job.id, []):
            self.check(other.revoked, f"{w} claimed {job.id} while {other} still holds it")
        claim = Claim(w, job, w.reg)
        self.claims.setdefault(job.id, []).append(claim)
        self.open.setdefault(job.id, []).append(claim)
        claim.prefetched = prefetched
        self.stats["claims"] += 1
        self.stats["prefetched"] += prefetched
        self.trace(f"{w} claims {claim} from {job.queue}{' (with its last result)' if prefetched else ''}")
        return claim

    def rows_before_prefetch(self, job: q.Job | None) -> dict:
        """The rows as the claim inside finish_and_claim saw them: the rows after its commit (the
        finish came first in the same transaction, nothing else since), the claimed job put back
        as waiting (the claim changed only its state, worker and run count)."""
        self.rows_stale = True
        rows = self.rows()
        if job is not None:
            r = rows[job.id]
            rows = {**rows, job.id: (r[0], q.PENDING, None, r[3] - 1, *r[4:])}
        return rows

    def outcome(self) -> q.Outcome:
        roll = self.rng.random()
        if roll < 0.6:
            return q.Outcome(0, None, b"ok\n", 0.2)
        if roll < 0.85:
            return q.Outcome(1, "exit code 1", b"boom\n", 0.2)
        if roll < 0.95:
            return q.Outcome(None, "timed out after 5s", b"", 5.0)
        return q.Outcome(137, "killed by signal SIGKILL", b"", 0.1)

    def finish(self, w: SimWorker, slot: int) -> None:
        self.record(w, slot, self.outcome())

    def record(self, w: SimWorker, slot: int, outcome: q.Outcome) -> None:
        """What Runner._write_outcome does, with the acceptance checked against the model."""
        claim = w.slots[slot]
        w.slots[slot] = None
        self.maybe_stuck(outcome)
        if outcome.interrupted:
            after = w.store.interrupt(claim.job, w.wid, outcome, False, self.wall, outcome.stuck)
        else:
            after = w.store.finish(claim.job, w.wid, outcome, w.store.config_all(), self.wall)
        self.on_recorded(claim, outcome, after)

    def maybe_stuck(self, outcome: q.Outcome) -> q.Outcome:
        """A run its worker cut short (an abort, a timeout) may leave a process it cannot kill
        (end_run): Outcome.stuck, and the job must go dead, never be rerun."""
        if (outcome.interrupted or (outcome.error or "").startswith("timed out")) and self.rng.random() < 0.05:
            outcome.stuck = "cannot kill leftover process 4242 (sim): permission denied"
        return outcome

    def on_recorded(self, claim: Claim, outcome: q.Outcome, after) -> None:
        self.stats["finishes"] += 1
        accepted = after is not None
        what = outcome.interrupted or outcome.error or "exit 0"
        self.trace(f"{claim.worker} records {claim} ({what}): {'accepted' if accepted else 'rejected'}")
        own = self.readoption(claim) if accepted and claim.revoked else None
        if own:
            self.took_back(claim, own)
        elif accepted == claim.revoked:
            self.fail(f"{claim.worker}'s write for {claim} was {'accepted' if accepted else 'rejected'}, "
                      f"but the claim was {'revoked' if claim.revoked else 'still its own'}")
        self.close(claim)
        if not accepted:
            self.stats["rejected"] += 1
        elif not outcome.interrupted:
            self.check_finish_rule(claim.job, outcome, after)
        else:
            self.check_interrupt_rule(claim, after, lost=False, stuck=outcome.stuck)

    def readoption(self, claim: Claim) -> Claim | None:
        """The adoption that holds the claim's run now if it is by the claim's own worker id (the
        worker was dropped, another sweeper adopted the run and died, and the worker, registered
        again, dropped that one and adopted the run back): the write guard knows worker ids, not
        registrations, so the old claim's write is accepted, and ends the adoption."""
        holder = self.holder(claim.job.id)
        if holder and holder.adopted and holder.worker is claim.worker and holder.job.run_count == claim.job.run_count:
            return holder
        return None

    def took_back(self, claim: Claim, adoption: Claim) -> None:
        self.stats["readopted"] += 1
        self.trace(f"{claim}'s write was accepted: {adoption} holds the run under the same worker id")
        self.close(adoption)

    def check_interrupt_rule(self, claim: Claim, state: str, lost: bool, stuck: str | None = None) -> None:
        """A run cut short is not an attempt: back to pending, or to the DLQ if canceled, lost too
        often, or a leftover process of it could not be killed (that error is then the job's)."""
        row = self.user.read(SQL_INTERRUPTED, (claim.job.id,))[0]
        lost_count = claim.job.lost_count + lost
        expected = (q.DEAD if stuck or row[3] or lost_count >= q.LOST_WORKER_CAP else q.PENDING, lost_count,
                    claim.job.attempts)
        self.check((row[0], row[1], row[2]) == expected and state == row[0] and (not stuck or row[4] == stuck),
                   f"{claim} cut short ({'lost' if lost else 'by its worker'}, cancel flag {row[3]}, stuck {stuck}): "
                   f"(state, lost_count, attempts, last_error) = {row[:3] + row[4:]}, expected {expected}")

    def check_finish_rule(self, job: q.Job, outcome: q.Outcome, after: q.Job) -> None:
        """DECISIONS.md's retry rule, restated independently of failure_rule: a success completes; a
        failure counts an attempt and retries until max(max_retries, 1) runs, except that a job a user
        canceled while it ran goes to the DLQ as canceled (the cancel beats a retry), and so does one
        whose run left a process that could not be killed (a retry could overlap it)."""
        canceled = self.user.read(SQL_INTERRUPTED, (job.id,))[0][3]
        if outcome.exit_code == 0 and outcome.error is None:
            expected = (q.COMPLETED, job.attempts)
        else:
            attempts = job.attempts + 1
            dead = canceled or attempts >= max(job.max_retries, 1) or outcome.stuck
            expected = (q.DEAD if dead else q.FAILED, attempts)
        self.check((after.state, after.attempts) == expected,
                   f"{job.id} after {outcome.error or 'exit 0'} (cancel flag {canceled}, stuck {outcome.stuck}): "
                   f"{(after.state, after.attempts)}, expected {expected}")

    def run_once(self, w: SimWorker, slot: int) -> None:
        """The real Runner.run_once(now) with a fake command; other steps interleave while it "runs".

        Half the time the worker keeps claiming: its result and its next claim commit together
        (Store.finish_and_claim), and the next run_once of this slot runs that prefetched job.
        """
        self.stats["runs"] += 1
        held = w.slots[slot]  # a job prefetched with this slot's last result, or None
        keep = self.rng.random() < 0.5
        runner = q.Runner(w.store, w.wid, lambda job, registration: None if registration == w.reg else
                          "worker lost its registration", queues=w.queues, current_registration=lambda: w.reg,
                          keep_claiming=lambda: keep)
        if held is not None:
            runner.prefetched = (held.job, held.reg)
        state = {}

        def execute(job, env, abort, on_output):
            claim = held if held is not None else self.on_claimed(w, job)
            self.check(claim is not None and claim.job.id == job.id, f"run_once ran {job.id}, not {claim}")
            state["claim"] = w.inline = w.slots[slot] = claim
            self.check(env["QUEUECTL_RUN"] == f"{w.wid}/{job.run_count}/{job.id}", f"run token {env}")
            on_output(b"partial", 7)
            roll = self.rng.random()
            if self.active and roll < 0.08:
                self.trace(f"{w} dies while {claim} runs")
                raise SimCrash()
            if roll < 0.6:
                self.nested(self.rng.randint(1, 5))
            reason = abort()
            state["outcome"] = self.maybe_stuck(q.Outcome(None, reason, b"", 0.1, interrupted=reason) if reason
                                                else self.outcome())
            return state["outcome"]

        runner.execute = execute
        self.trace(f"{w} run_once{' of prefetched ' + repr(held) if held else ''}{' (keeps claiming)' if keep else ''}")
        self.rows()  # as they were before the claim inside run_once
        now = self.wall
        try:
            ran = runner.run_once(now=now)
        except SimCrash:  # the claim stays in its slot, with the dead process
            w.inline = None
            self.mark_crashed(w)
            return
        w.inline = w.slots[slot] = None
        claim = state.get("claim")
        self.check(ran == (claim is not None), f"run_once returned {ran}, claim {claim}")
        if claim is not None:
            self.check_inline_result(claim)
        # The claim with the result was made at `now`, the time run_once was given, not the wall
        # clock of now (time passed while the job "ran").
        if runner.prefetched:
            job, registration = runner.prefetched
            self.check(registration == w.reg, f"prefetched under registration {registration}, now {w.reg}")
            w.slots[slot] = self.on_claimed(w, job, self.rows_before_prefetch(job), now, prefetched=True)
        elif keep and claim is not None and not state["outcome"].interrupted:  # it claimed with the result: nothing
            self.on_claimed(w, None, self.rows_before_prefetch(None), now, prefetched=True)

    def check_inline_result(self, claim: Claim) -> None:
        """run_once does not say whether its write was accepted: the run row tells."""
        outcome, owner = self.user.read(SQL_RUN_OUTCOME, (claim.job.id, claim.job.run_count))[0]
        own = self.readoption(claim) if claim.revoked and outcome is not None else None
        if own:  # its adoption is open, yet the run is closed: this write was accepted
            self.took_back(claim, own)
        elif claim.revoked:  # adopted: the adopter has requeued it, or not yet
            self.check(outcome in (None, "lost", "canceled"),
                       f"{claim}: adopted, yet its run was recorded as {outcome!r}")
            self.stats["rejected"] += 1
            self.trace(f"{claim.worker} run_once of {claim}: result discarded (run is 'lost')")
        else:
            self.check(outcome in ("completed", "failed", "dead", "stopped", "canceled"),
                       f"{claim}: its own result was not recorded (run outcome {outcome!r})")
            self.trace(f"{claim.worker} run_once of {claim}: recorded {outcome}")
        self.close(claim)
        self.stats["finishes"] += 1

    # -- faults ---------------------------------------------------------------------------------------

    def crash(self, w: SimWorker) -> None:
        self.trace(f"{w} crashes (stops stepping and beating)")
        self.mark_crashed(w)

    def mark_crashed(self, w: SimWorker) -> None:
        self.stats["crashes"] += 1
        w.crashed = True

    def come_back(self, w: SimWorker) -> None:
        """A paused process resumes: runs that ended meanwhile report with their old claim, then it beats."""
        self.stats["comebacks"] += 1
        w.crashed = False
        self.trace(f"{w} comes back")
        for i, claim in enumerate(w.slots):
            if claim is not None and self.rng.random() < 0.5:
                self.finish(w, i)
        self.beat(w)

    def restart(self, w: SimWorker) -> None:
        """The crashed process is gone for good (its runs died with it); a new worker process starts."""
        self.trace(f"{w} is gone for good; a new worker process starts")
        w.crashed, w.exited = False, True
        self.spawn()

    def hard_stop(self, w: SimWorker) -> None:
        """A stop: kill the runs and put them back; requeue what its sweeper adopted (Worker.
        _finish_recoveries: bounded by HARD_STOP_S); deregister. It exits whatever the database
        does: a result it could not record (the database was busy) stays processing, the row stays
        if the deregistration failed too, an adopted run not requeued in time stays adopted: all of
        it is crash recovery's (an orphan's, or a silent worker's)."""
        self.trace(f"{w} stops (hard)")
        for i, claim in enumerate(w.slots):
            if claim is None:
                continue
            if self.rng.random() < 0.2:
                self.trace(f"{w} gives up recording {claim}: left to crash recovery")
                continue
            self.record(w, i, q.Outcome(None, "worker hard stop", b"", 0.1, interrupted="worker hard stop"))
        w.exited = True  # its threads and main loop are done: no more beats, sweeps or claims
        if not any(x.up for x in self.workers):
            self.spawn()
        deadline = self.mono + self.rng.uniform(0, q.HARD_STOP_S)
        self.busy_main.add(w)
        self.waited = 0.0
        try:
            while w.sweeper.recovering and self.mono < deadline:
                n = w.sweeper.finish(self.wall)
                self.trace(f"{w} finishes its recoveries: {n} requeued, {len(w.sweeper.recovering)} left"
                           + (f" (waited {self.waited:.2f}s)" if self.waited else ""))
        except q.Busy as e:
            self.trace(f"{w} could not requeue the jobs it adopted ({e}): the next worker will")
        except SimCrash:
            self.trace(f"{w} dies while it finishes its recoveries")
            self.mark_crashed(w)
            w.dead = True
            return
        finally:
            self.busy_main.discard(w)
        if self.rng.random() < 0.2:
            self.trace(f"{w} could not deregister: its row stays until a sweeper drops it")
        else:
            w.store.deregister(w.wid)
            w.registered = False
            self.trace(f"{w} deregisters" + (f", leaving {list(w.sweeper.recovering)} adopted"
                                             if w.sweeper.recovering else ""))

    def nested(self, n: int) -> None:
        """Run n other steps now, in the middle of something (another process's transactions)."""
        self.check_invariants()  # the interrupted process may have written: check at this boundary too
        self.depth += 1
        try:
            for _ in range(n):
                self.step()
                self.check_invariants()
        finally:
            self.depth -= 1

    # -- model lookups ----------------------------------------------------------------------------------

    def worker_by_id(self, wid: str) -> SimWorker:
        return next(w for w in self.workers if w.wid == wid)

    def holder(self, job_id: str) -> Claim | None:
        """The claim or adoption that holds the job now (check_claims: at most one)."""
        return next((c for c in self.open.get(job_id, ()) if not c.revoked), None)

    def holders(self):
        return (c for claims in self.open.values() for c in claims if not c.revoked)

    def close(self, claim: Claim) -> None:
        claim.closed = True
        self.open[claim.job.id].remove(claim)

    def rows(self) -> dict[str, tuple]:
        """Every job row by id, as of the last change. Read again after a write; when the rows read
        are those already held (a beat or a sweep wrote only the workers table) the old dict stays,
        so what check_polls derived from it stays valid."""
        if self.rows_stale:
            rows = {r[0]: r for r in self.user.read(SQL_ROWS)}
            if rows != self._rows:
                self._rows = rows
            self.rows_stale = False
        return self._rows

    # -- invariants -------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        # The database is read again only if something was committed since the last check: another
        # connection committed (data_version) or the user's changed a row (total_changes). Otherwise
        # every query would return what it did then (its answer is a function of the content), so a
        # step that wrote nothing (a tick, a claim that found nothing) costs one PRAGMA here; the
        # checks against the model, which changes without a write (a crash, a revoked claim, the
        # clock), run every time. A claim's "before" snapshot (self.rows()) relies on this being exact.
        conn = self.user.conn
        version = (conn.execute(SQL_DATA_VERSION).fetchone()[0], conn.total_changes)
        if version != self.version:
            self.version, self.rows_stale = version, True
            self.check_rows()
        rows = self.rows()
        if rows.keys() != self.jobs:  # an enqueue that wrote nothing changes only the model
            self.fail(f"jobs lost or invented: {sorted(self.jobs ^ set(rows))}")
        self.check_claims(self.held)
        self.check_polls()

    def check_rows(self) -> None:
        """After a commit: the open runs against the processing rows; the per-row rules and
        Store.counts() if a job row changed (a beat or a drop writes only the workers table)."""
        rows = self.rows()
        if rows is not self.audited:
            self.held = self.audit(rows)
            self.audited = rows
        open_runs = {}
        for job_id, run_no, wid in self.user.read(SQL_OPEN_RUNS):
            if job_id in open_runs:
                self.fail(f"{job_id} has two open runs")
            open_runs[job_id] = (run_no, wid)
        if {j: r[0] for j, r in open_runs.items()} != {j: h[0] for j, h in self.held.items()}:
            self.fail(f"open runs {open_runs} != processing rows {self.held}")
        self.open_runs = open_runs  # their worker: who started the run (an adopter holds it, but did not start it)
        backwards = self.user.read(SQL_RUN_BACKWARDS)
        if backwards:
            self.fail(f"run {backwards[0][0]}#{backwards[0][1]} ended before it started: {backwards[0][2:]}")

    def audit(self, rows: dict) -> dict:
        """Check the per-row rules and Store.counts(); the (run, worker) of each processing job."""
        by_state = dict.fromkeys(q.STATES, 0)
        held = {}
        for r in rows.values():
            job_id, state = r[0], r[1]
            if state not in by_state or r[7] < 0:
                self.fail(f"{job_id}: state {state!r}, waiting_on {r[7]}")
            by_state[state] += 1
            if r[4] > max(r[5], 1):
                self.fail(f"{job_id}: attempts {r[4]} > max(max_retries {r[5]}, 1)")
            if r[6] > q.LOST_WORKER_CAP:
                self.fail(f"{job_id}: lost_count {r[6]} over the cap")
            if state == q.PROCESSING:
                if r[2] is None:
                    self.fail(f"{job_id}: state {state} with worker {r[2]}")
                held[job_id] = (r[3], r[2])
            elif r[2] is not None:
                self.fail(f"{job_id}: state {state} with worker {r[2]}")
            elif state == q.DEAD and r[11] is None:
                self.fail(f"{job_id}: dead without a reason")
        counts = self.user.counts()
        if counts != by_state:
            self.fail(f"Store.counts() {counts} != rows {by_state}")
        return held

    def check_polls(self) -> None:
        """The poller's and --burst's checks, for the queues of each live worker, against the model."""
        rows = self.rows()
        soon = self.wall + q.BURST_HORIZON_S
        queue_sets = tuple(dict.fromkeys(w.queues for w in self.workers if w.up))
        # Their answers depend only on the rows, the paused queues and which jobs are due by now and
        # by the horizon: most steps (a tick, a beat) change none of that, and are not asked again.
        if self.due_times[0] is not rows:
            self.due_times = (rows, sorted(r[9] for r in rows.values()))
        times = self.due_times[1]
        key = (rows, self.paused_all, frozenset(self.paused), frozenset(self.resumed), queue_sets,
               bisect.bisect_right(times, self.wall), bisect.bisect_right(times, soon))
        if key == self.polled:
            return
        self.polled = key
        now = self.wall
        staged_due = any(r[1] in WAITING and r[7] == 0 and not r[13] and r[9] <= now for r in rows.values())
        for queues in queue_sets:
            eligible = next(self.eligible_rows(rows, queues, now), None)
            due = self.user.due_now(now, queues)
            if eligible and not due:
                self.fail(f"due_now False for {self.where(queues)}, yet {eligible[0]} is eligible")
            if due and not eligible and not staged_due:
                self.fail(f"due_now True for {self.where(queues)} with nothing eligible nor staged and due "
                          "(a busy poll)")
            busy = any(r[1] == q.PROCESSING or r[1] in WAITING and r[7] == 0 and r[9] <= soon
                       and self.claimable(r[12], queues) for r in rows.values() if not queues or r[12] in queues)
            done = self.user.burst_done(now, queues)
            if done == busy:
                self.fail(f"burst_done {done} for {self.where(queues)}, yet {'work is' if busy else 'nothing is'} "
                          f"processing or due within {q.BURST_HORIZON_S:g}s there")

    def where(self, queues: tuple) -> str:
        return f"queues {queues or 'all'}, paused {self.paused_text()}"

    def check_claims(self, held: dict) -> None:
        owned = {}
        for job_id, claims in self.open.items():
            if not claims:
                continue
            live = [c for c in claims if c.worker.up and c.worker.registered and c.reg == c.worker.reg]
            if len(live) > 1:
                self.fail(f"{job_id} is held by two live owners: {live}")
            current = [c for c in claims if not c.revoked]
            if len(current) > 1:
                self.fail(f"{job_id} has two unrevoked claims: {current}")
            if sum(1 for c in claims if c.adopted and not c.revoked) > 1:
                self.fail(f"{job_id} is adopted by two sweepers at once: {claims}")
            if current:
                owned[job_id] = (current[0].job.run_count, current[0].worker.wid)
                started_by = self.open_runs.get(job_id, (None, None))[1]
                if started_by != current[0].starter:
                    self.fail(f"{current[0]} holds {job_id}, whose open run was started by {started_by}, "
                              f"not {current[0].starter}")
        if owned != held:
            self.fail(f"unrevoked claims {owned} != processing rows {held}")


# ==== scenarios: interleavings the random search found, written out by hand ===========================
# Each is a few lines with the real Store and Sweeper, fake clocks, and a store wrapper that lets
# another process act between two of the sweeper's transactions. They state the property plainly
# and run as checks of their own (`--scenarios`; part of --short).

def _ident(name: str) -> dict:
    """A worker on a host of its own: judged by its heartbeat lease only."""
    return {"host": f"host-{name}", "pid": 4242, "proc_start": "1", "boot_id": "sim-boot", "pid_ns": f"ns-{name}"}


def sweep(sweeper: q.Sweeper, t: float) -> int:
    """A sweep at time t: the wall clock and queuectl's monotonic clock (a SimClock in scenarios) both read t."""
    q.time.mono = t
    return sweeper.sweep(t)


def _add_job(store: q.Store, job_id: str, now: float) -> None:
    store.enqueue([q.validate_job({"id": job_id, "command": "true"}, store.config_all(), "/", now)], now)


class _Between:
    """A sweeper's store that runs `hook` right after the named call returns (another process acts then)."""

    def __init__(self, store: q.Store, after: str, hook):
        self.store, self.after, self.hook = store, after, hook

    def __getattr__(self, name):
        method = getattr(self.store, name)
        if name != self.after:
            return method

        def wrapped(*args):
            result = method(*args)
            hook, self.hook = self.hook, None
            if hook:
                hook()
            return result
        return wrapped


def scenario_reregistered_worker_same_beat(store: q.Store, procs: FakeProcs) -> str | None:
    """A worker presumed dead registers again under the same id; its beat counter restarts, so a
    sweeper that remembers the old registration's beat sees "unchanged for long" and drops it at once."""
    for w in "WXY":
        store.register(w, _ident(w), 1, 0.0)
    x, y = q.Sweeper(store, _ident("X"), "X"), q.Sweeper(store, _ident("Y"), "Y")
    store.heartbeat("W", 1.0)  # W's beat: 1
    sweep(x, 1.0)  # X remembers (W, beat 1) at 1 s
    sweep(y, 2.0)  # W pauses
    store.heartbeat("X", 19.0)
    sweep(y, 20.0)  # 18 s without a beat: Y drops W (rightly)
    if store.heartbeat("W", 21.0) is not None:
        return "W's row was not dropped"
    store.register("W", _ident("W"), 1, 21.0)  # W resumes and registers again, as Worker does
    store.heartbeat("W", 22.0)  # beat 1 again
    _add_job(store, "J", 22.0)
    store.claim("W", 22.0)
    sweep(x, 22.5)  # half a second after W's heartbeat
    if not any(w.id == "W" for w in store.workers()):
        return (f"X dropped W 0.5 s after its heartbeat (the beat counter restarted at the new registration and "
                f"matched the one X remembered from the old); J was requeued while W runs it: "
                f"state {store.get('J').state}, lost_count {store.get('J').lost_count}")
    return None


def scenario_claim_between_drop_and_list(store: q.Store, procs: FakeProcs) -> str | None:
    """A sweeper drops a worker's row, then lists its jobs in a later transaction: a worker that
    registered again in between (same id) and claimed a job loses that job, though it is alive."""
    store.register("W", _ident("W"), 1, 0.0)
    store.register("X", _ident("X"), 1, 0.0)
    _add_job(store, "J", 0.0)
    claimed = []

    def w_comes_back():
        store.heartbeat("W", 20.0)  # None: its row is gone
        store.register("W", _ident("W"), 1, 20.0)
        claimed.append(store.claim("W", 20.0))

    x = q.Sweeper(_Between(store, "drop_worker", w_comes_back), _ident("X"), "X")
    sweep(x, 0.0)
    store.heartbeat("X", 19.0)
    sweep(x, 20.0)  # W silent for 20 s: dropped; then W's jobs are listed
    job = store.get("J")
    if claimed and claimed[0] and job.state != q.PROCESSING:
        return (f"W registered again and claimed J between X's drop_worker and jobs_of; X then requeued J "
                f"(state {job.state}, lost_count {job.lost_count}) while W, registered and beating, runs it")
    return None


def scenario_sweeper_stalls_before_reading(store: q.Store, procs: FakeProcs) -> str | None:
    """The sweeper reads its clock, then the rows: a stall in between (the process stopped, a slow
    read) dates a fresh heartbeat back to the clock reading, and the worker is dropped that much early."""
    store.register("W", _ident("W"), 1, 0.0)
    store.register("X", _ident("X"), 1, 0.0)
    x = q.Sweeper(store, _ident("X"), "X")
    sweep(x, 0.0)
    store.heartbeat("W", 99.0)
    sweep(x, 99.5)

    def stall():  # 15 s pass (the sweeping process is stopped, or its read is slow); W beats meanwhile
        q.time.mono = 115.0
        store.heartbeat("W", 115.0)
    x.store = _Between(store, "config_get", stall)
    sweep(x, 100.0)  # clock read at 100 s; the rows, read at 115 s, hold W's new beat
    x.store = store
    store.heartbeat("X", 115.5)
    sweep(x, 116.0)  # 1 s after W's heartbeat (W beats every 2 s)
    if not any(w.id == "W" for w in store.workers()):
        return "X dropped W 1 s after its heartbeat: the beat seen at 115 s was dated 100 s, the clock reading"
    return None


def _local_ident(procs: FakeProcs) -> dict:
    """A worker on the sweepers' own host and PID namespace: judged by its (fake) PID, not its lease."""
    pid = procs.spawn("", 0.0)  # its own process: alive until procs.end(pid)
    return {"host": "host-shared", "pid": pid, "proc_start": f"sim{pid}", "boot_id": "sim-boot",
            "pid_ns": "ns-shared"}


def _lost_runs(store: q.Store, job_id: str) -> list[int]:
    return [r["run"] for r in store.runs(job_id) if r["outcome"] == "lost"]


def scenario_two_sweepers_one_recovery(store: q.Store, procs: FakeProcs) -> str | None:
    """Two sweepers find the same dead worker, then the same orphan, at once. Exactly one of them
    adopts the run; its kill leaves a process still exiting, so it keeps the run for a later sweep.
    The other must leave the job alone, although its own kill scan would find nothing (a killed
    process's environment reads empty at once): requeued then, it could start while the old run
    still holds its files. Once the process is gone the adopter requeues it, once."""
    w_ident, x_ident, y_ident = _local_ident(procs), _local_ident(procs), _local_ident(procs)
    for name, ident in (("W", w_ident), ("X", x_ident), ("Y", y_ident)):
        store.register(name, ident, 1, 0.0)
    _add_job(store, "J", 0.0)
    store.claim("W", 0.0)
    procs.spawn("W/1/J", teardown_s=2.0)  # J's shell: 2 s to exit once killed
    procs.end(w_ident["pid"])  # W dies
    y = q.Sweeper(store, y_ident, "Y")
    # X reads the workers (W is dead), then Y sweeps before X acts on it
    x = q.Sweeper(_Between(store, "workers", lambda: sweep(y, 1.0)), x_ident, "X")
    sweep(x, 1.0)
    job = store.get("J")
    if (job.state, job.worker_id) != (q.PROCESSING, "Y") or list(y.recovering) != [("J", 1)] or x.recovering:
        return (f"both saw W dead: J should be Y's alone, waiting for its process to exit; J is {job.state} "
                f"held by {job.worker_id}, Y recovers {list(y.recovering)}, X {list(x.recovering)}")
    if not q.kill_run("W/1/J").gone():
        return "a second kill scan of J's run should find nothing (its process was killed, still exiting)"
    x.store = store
    sweep(x, 2.0)
    if store.get("J").state != q.PROCESSING or x.recovering:
        return f"X requeued J (now {store.get('J').state}), which Y adopted, while J's process is still exiting"
    sweep(y, 3.5)  # the process is gone
    job = store.get("J")
    if (job.state, job.lost_count, _lost_runs(store, "J")) != (q.PENDING, 1, [1]) or y.recovering:
        return (f"Y should have requeued J once: {job.state}, lost_count {job.lost_count}, "
                f"lost runs {_lost_runs(store, 'J')}")

    # The same with an orphan: V's row is gone (a hard stop that could not record K's result).
    v_ident = _local_ident(procs)
    store.register("V", v_ident, 1, 4.0)
    store.enqueue([q.validate_job({"id": "K", "command": "true", "queue": "k"}, store.config_all(), "/", 4.0)], 4.0)
    store.claim("V", 4.0, ("k",))  # K, not J (pending again)
    procs.spawn("V/1/K", teardown_s=2.0)
    store.deregister("V")
    x = q.Sweeper(_Between(store, "swept_jobs", lambda: sweep(y, 5.0)), x_ident, "X")
    sweep(x, 5.0)  # X lists K as an orphan; Y sweeps then and adopts it; X's adopt must find it taken
    job = store.get("K")
    if (job.state, job.worker_id) != (q.PROCESSING, "Y") or list(y.recovering) != [("K", 1)] or x.recovering:
        return (f"both saw orphan K: K should be Y's alone, waiting for its process to exit; K is {job.state} held "
                f"by {job.worker_id}, Y recovers {list(y.recovering)}, X {list(x.recovering)}")
    x.store = store
    sweep(x, 6.0)
    if store.get("K").state != q.PROCESSING:
        return f"X requeued K (now {store.get('K').state}), which Y adopted, while K's process is still exiting"
    sweep(y, 7.5)
    job = store.get("K")
    if (job.state, job.lost_count, _lost_runs(store, "K")) != (q.PENDING, 1, [1]) or y.recovering:
        return (f"Y should have requeued K once: {job.state}, lost_count {job.lost_count}, "
                f"lost runs {_lost_runs(store, 'K')}")
    return None


SCENARIOS = [scenario_reregistered_worker_same_beat, scenario_claim_between_drop_and_list,
             scenario_sweeper_stalls_before_reading, scenario_two_sweepers_one_recovery]


# ---- more interleavings: a stop while an adopted run exits, an adopter on another host

def scenario_stop_while_adopted_run_exits(store: q.Store, procs: FakeProcs) -> str | None:
    """X adopts an orphan and kills its run, whose process takes 3 s to exit; X is hard-stopped with
    1 s left, so Worker._finish_recoveries gives up and X deregisters. The run is an orphan
    again; Y adopts it, and Y's kill scan cannot find a process already sent SIGKILL (its environment
    reads empty at once): had X left at once, Y would requeue K while the old run still held its files.
    X must wait for its adopted runs' processes before it leaves."""
    x_ident, y_ident, v_ident = _local_ident(procs), _local_ident(procs), _local_ident(procs)
    for name, ident in (("X", x_ident), ("Y", y_ident), ("V", v_ident)):
        store.register(name, ident, 1, 0.0)
    _add_job(store, "K", 0.0)
    store.claim("V", 0.0)
    procs.spawn("V/1/K", teardown_s=3.0)
    store.deregister("V")  # a hard stop that could not record K's result
    x = q.Sweeper(store, x_ident, "X")
    sweep(x, 1.0)  # adopts K, kills its process (gone at 4 s), keeps it
    worker = q.Worker.__new__(q.Worker)  # only what _finish_recoveries reads
    worker.sweeper, worker.store, worker.hard_at = x, store, q.time.mono - (q.HARD_STOP_S - 1.0)
    worker._finish_recoveries()
    store.deregister("X")
    sweep(q.Sweeper(store, y_ident, "Y"), q.time.mono)
    if store.get("K").state != q.PROCESSING and procs.of("V/1/K"):
        return (f"Y requeued K (now {store.get('K').state}) at {q.time.mono:.1f} s while the process X killed "
                f"at 1 s is still exiting (gone at 4 s): X stopped with its recovery unfinished")
    return None


def scenario_adopter_of_another_host(store: q.Store, procs: FakeProcs) -> str | None:
    """W's run leaves a process on W's host when W dies. B, on another host, drops W by its lease,
    adopts the run (nothing to kill there) and dies before requeuing it. X, a worker started since
    on W's host, drops B by its lease and adopts the run. Choosing whether to look for the run's
    processes by B's namespace, not by that of W, which started the run, X would requeue it without
    looking on its own host: every adopted run must be looked for here."""
    w_ident, x_ident = _local_ident(procs), _local_ident(procs)
    store.register("W", w_ident, 1, 0.0)
    store.register("B", _ident("B"), 1, 0.0)
    _add_job(store, "J", 0.0)
    store.claim("W", 0.0)
    procs.spawn("W/1/J", teardown_s=0.1)  # a child that left W's process group: still running
    procs.end(w_ident["pid"])  # W dies
    b = q.Sweeper(store, _ident("B"), "B")
    sweep(b, 0.0)
    store.heartbeat("B", 19.0)
    w_row = next(row for row in store.workers() if row.id == "W")
    store.drop_worker("W", w_row.beat, w_row.started_at, "B")  # B's sweep at 20 s; B dies right after
    store.register("X", x_ident, 1, 20.0)
    x = q.Sweeper(store, x_ident, "X")
    sweep(x, 20.0)
    store.heartbeat("X", 31.0)
    sweep(x, 31.0)  # B silent for 12 s: dropped, J adopted and requeued
    if store.get("J").state != q.PROCESSING and procs.of("W/1/J"):
        return (f"X requeued J (now {store.get('J').state}) without killing the process W's run left on X's own "
                f"host (token {'W/1/J'!r} never asked for: {sorted(procs.killed_tokens)})")
    return None


SCENARIOS += [scenario_stop_while_adopted_run_exits, scenario_adopter_of_another_host]


def run_scenarios(scenarios: list | None = None) -> list[str]:
    """Run every scenario on a fresh database; the failures, named."""
    _quiet()
    failures = []
    for scenario in SCENARIOS if scenarios is None else scenarios:
        folder = tempfile.mkdtemp(prefix="queuectl-scenario-")
        store = q.SqliteStore(os.path.join(folder, "s.db"), durable=False)
        clock = SimClock(time)
        procs = FakeProcs(clock)
        try:
            with Patched(clock, procs):
                problem = scenario(store, procs)
        finally:
            store.close()
            shutil.rmtree(folder, ignore_errors=True)
        if problem:
            failures.append(f"scenario {scenario.__name__}: {problem}")
    return failures


# ==== driving many seeds =============================================================================

class Bench:
    """A temporary database and its pooled connections, reset between seeds (a fresh file behaves the same)."""

    def __init__(self):
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="queuectl-sim-", dir=base)
        path = os.path.join(self.dir, "sim.db")
        self.stores = [q.SqliteStore(path, durable=False, busy_deadline_s=5.0) for _ in range(POOL)]

    def reset(self) -> None:
        self.stores[0].write(lambda cur: [cur.execute(sql) for sql in RESET])

    def close(self) -> None:
        for s in self.stores:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _quiet() -> None:
    logging.getLogger("queuectl").setLevel(logging.CRITICAL + 1)  # discarded-result warnings are expected


def run(seed: int, steps: int = 200, *, trace: bool = False, bench: Bench | None = None) -> dict:
    """Simulate one seed; AssertionError (with the seed and step) on any violation; returns counters."""
    _quiet()
    own = bench is None
    bench = bench or Bench()
    sim = Simulation(bench.stores, seed, steps, trace)
    try:
        with Patched(sim.clock, sim.procs):  # the simulated clock and processes (no real processes here)
            bench.reset()
            sim.run()
    except Violation as e:
        raise AssertionError(str(e)) from None
    finally:
        if own:
            bench.close()
    return sim.stats


def run_many(seeds, steps: int = 200) -> dict:
    """Run the seeds on one reused database; AssertionError on the first violation; summed counters."""
    total = _run_seeds(seeds, steps, stop_at_first=True)
    if total["failures"]:
        raise AssertionError(total["failures"][0])
    return total


def _run_seeds(seeds, steps: int, stop_at_first: bool) -> dict:
    """Run the seeds, collecting failures (stopping at the first one if asked); summed counters."""
    bench = Bench()
    total: dict = {"seeds": 0, "failures": []}
    try:
        for seed in seeds:
            try:
                stats = run(seed, steps, bench=bench)
            except AssertionError as e:
                total["failures"].append(str(e))
                if stop_at_first:
                    break
                continue
            for key, value in stats.items():
                total[key] = total.get(key, 0) + value
            total["seeds"] += 1
    finally:
        bench.close()
    return total


def _run_chunk(args: tuple) -> dict:
    seeds, steps, keep_going = args
    return _run_seeds(seeds, steps, stop_at_first=not keep_going)


def run_parallel(seeds: list[int], steps: int, procs: int, keep_going: bool = False) -> dict:
    """run_many over `procs` processes (seeds are independent); failures are collected, not raised."""
    if procs <= 1:
        return _run_chunk((seeds, steps, keep_going))
    import multiprocessing
    chunks = [(seeds[i::procs], steps, keep_going) for i in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_run_chunk, chunks)
    total: dict = {"seeds": 0, "failures": []}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value if key != "failures" else total["failures"] + value
    total["failures"].sort(key=lambda f: int(f.split(",")[0].split()[-1]))
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, help="run this one seed (reproduces a failure exactly)")
    p.add_argument("--seeds", type=int, default=2000, help="how many seeds (default 2000)")
    p.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--steps", type=int, default=200, help="active steps per seed before the drain (default 200)")
    p.add_argument("--short", action="store_true",
                   help=f"the bounded run of `make test` ({SHORT_SEEDS:,} seeds x {SHORT_STEPS} steps)")
    p.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    p.add_argument("--keep-going", action="store_true", help="report every failing seed, not just the first")
    p.add_argument("--trace", action="store_true", help="with --seed: print every step")
    p.add_argument("--scenarios", action="store_true", help="only the hand-written scenarios (part of --short)")
    args = p.parse_args(argv)
    if args.scenarios or args.short:
        failed = run_scenarios(SCENARIOS)
        for failure in failed:
            print(f"simulate: FAILED: {failure}", file=sys.stderr)
        print(f"simulate: {len(SCENARIOS) - len(failed)} of {len(SCENARIOS)} scenarios passed")
        if args.scenarios:
            return 1 if failed else 0
    if args.short:
        args.seeds, args.steps = SHORT_SEEDS, SHORT_STEPS
    started = time.monotonic()
    if args.seed is not None:
        try:
            stats = {**run(args.seed, args.steps, trace=args.trace), "seeds": 1, "failures": []}
        except AssertionError as e:
            stats = {"seeds": 0, "failures": [str(e)]}
    else:
        stats = run_parallel(list(range(args.first, args.first + args.seeds)), args.steps, args.procs,
                             args.keep_going)
    took = time.monotonic() - started
    for failure in stats["failures"]:
        seed = failure.split(",")[0].split()[-1]
        print(f"simulate: FAILED: {failure}", file=sys.stderr)
        print(f"  reproduce: python3 bench/simulate.py --seed {seed} --steps {args.steps} --trace\n", file=sys.stderr)
    print(f"simulate: {stats['seeds']} seeds passed, {len(stats['failures'])} failed ({args.steps} steps each "
          f"+ drain) in {took:.1f}s: "
          + ", ".join(f"{k} {v}" for k, v in stats.items() if k not in ("seeds", "failures")))
    return 1 if stats["failures"] or (args.short and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
