#!/usr/bin/env python3
"""Seeded fuzzing of queuectl's input handling: thousands of malformed and hostile inputs.

Every case runs in this process through `queuectl.main([...])` (stdout, stderr and stdin replaced),
against a temporary database holding one job in each state. The inputs:

  enqueue JSON       job objects built field by field from valid and hostile values (wrong types,
                     out-of-range and huge numbers, 1e309, -0, NaN, lone surrogates, NULs, control
                     characters, very long ids and commands, unknown and duplicate keys, deep
                     nesting, truncated or trailing text, non-objects)
  enqueue -          JSON Lines or a JSON array of such jobs as stdin bytes, with invalid UTF-8,
                     huge lines, blank lines, CRLF, duplicate ids, dependencies inside the batch
  config set K V     valid, out-of-range and unparsable values, unknown keys
  id commands        show, logs [--run N], cancel, delete, dlq retry, wait --timeout 0 with
                     existing, missing and invalid ids (empty, 201 characters, control
                     characters, lone surrogates, option-like)
  views              list / status / config get with hostile options

Each case knows which exit codes the rules allow (0 accepted; 2 invalid input; 1 valid but
impossible: an id taken, a dependency or job missing, a dependency dead, a job in the wrong state), and
the checks are:
the exit code is 0, 1 or 2 and one the rules allow; nothing escapes main() and stderr never holds a
traceback; a failure prints one `queuectl: error:` line; the database is unchanged (a dump of its
tables) after every non-zero exit and after every read-only command; an accepted enqueue stored
exactly the jobs it printed.

Every case has its own random generator seeded from (seed, case number) and starts from the same
database, so `--seed S --case N` replays one case exactly; a failing case prints its input.

With --pg URL (a PostgreSQL server), the database is a fresh schema of that server (?schema=fuzz_<hex>),
dropped at the end (on failure too). The starting jobs are made through queuectl's Store, every case
runs main() with the schema's URL, the dump is read through a Store on the same schema, and a case
that changed the database is undone by putting the starting rows back in one transaction (every table
emptied and refilled, the id sequences set back), PostgreSQL's counterpart of copying the file back.
"""

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import queuectl as q  # noqa: E402

OK, INVALID, IMPOSSIBLE = {0}, {2}, {1}
MAX_SECONDS = 10 * 365 * 86400
MAX_UNIX_TIME = 253_402_300_799
# The database every case starts from: id -> state.
EXISTING = {"pend": "pending", "ünï-code 😀": "pending", "child": "pending", "done": "completed",
            "dead1": "dead", "dead2": "dead", "fail": "failed", "proc": "processing"}
DEPENDS = {"child": ["pend"], "dead2": ["dead1"]}  # the edges among them
WITH_RUNS = {"done", "dead1", "fail", "proc"}  # jobs with exactly one run
TABLES = ("jobs ORDER BY seq", "deps ORDER BY job_id, dep_id", "runs ORDER BY job_id, run_no",
          "config ORDER BY key", "paused ORDER BY queue", "workers ORDER BY id")
READ_ONLY = {"show", "logs", "wait", "list", "status", "config get"}

TEXT_PIECES = ["a", "echo hi", " ", "é", "中文", "😀", "\t", "\n", "\r", "\x01", "\x1b[31m", "\x7f", "\x85",
               "\u2028", "\u2029", "\ufeff", "'", '"', "\\", "$(id)", "`id`", ";", "|", "&", "*", "%s", "{}",
               "\ufffd", "\U0010ffff", "\u0301", "-", "--", "/"]


# ==== values: (JSON text, valid?) =====================================================================

def dumps(rng: random.Random, value) -> str:
    """JSON text of a value, sometimes with non-ASCII characters raw (U+2028 and U+0085 included)."""
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


def some_text(rng: random.Random, n: int | None = None) -> str:
    return "".join(rng.choice(TEXT_PIECES) for _ in range(n if n is not None else rng.randint(1, 12)))


def valid_id_text(rng: random.Random) -> str:
    """A valid id no existing job has (they never contain '~')."""
    core = "".join(rng.choice("abcXYZ019._-:/ éü中😀'\"\\{}") for _ in range(rng.randint(0, 12)))
    job_id = f"~{core}~{rng.getrandbits(40):x}"
    if rng.random() < 0.1:  # exactly the longest allowed
        job_id = (job_id * 200)[:200]
    return job_id


def invalid_id_value(rng: random.Random):
    """A Python value that is not a valid id (type, length, control characters, NUL, surrogates)."""
    return rng.choice([
        "", "x" * 201, "é" * 201, "a\nb", "a\tb", "\x00", "a\x00b", "\x7f", "a\x85b", "a\u2028b", "\u2029",
        "\x1b[0m", "\ud800", "a\udfffb", "\udcff", 5, 0, -1, 1.5, True, None, [], ["a"], {}, {"id": "a"},
    ])


def id_value(rng: random.Random) -> tuple:
    """(value, kind) where kind is 'new', 'existing' or 'invalid'."""
    roll = rng.random()
    if roll < 0.55:
        return valid_id_text(rng), "new"
    if roll < 0.75:
        return rng.choice(sorted(EXISTING)), "existing"
    return invalid_id_value(rng), "invalid"


def number_texts(rng: random.Random, low: float, high: float, integer: bool,
                 duration: bool = False) -> tuple[str, bool]:
    """A JSON number text (or a non-number) and whether it is valid for [low, high]. A duration also
    takes a string of digits with at most one unit ("3", "15m"), never a sign or an exponent."""
    valid = [str(int(low)), str(int(high)), "-0" if low <= 0 else str(int(low)), str(rng.randint(int(low), int(high)))]
    invalid = [str(int(high) + 1), str(int(low) - 1), "1e309", "-1e309", "NaN", "Infinity", "-Infinity",
               "9" * 5000, str(10 ** 30), "true", "false", "null", "[]", "{}", '"1e3"', "1" * 400 + ".0",
               '"-1"', '"1 h"', '"1H"']
    if duration:
        valid += ['"3"', '"15m"', '"1.5h"', '"1w"', '" 2d "']
    else:
        invalid += ['"3"']
    if integer:
        invalid += ["1.5", "3.0", "1e2", "-0.0", "0.0"]
    else:
        valid += ["-0.0", "0.5", "1e-300", "5e-324", "1e-400", f"{high}", f"{high:.1f}"]
        invalid += [f"{high * 1.0000001}", "-1e-300", "-0.5"]
    if rng.random() < 0.5:
        return rng.choice(valid), True
    return rng.choice(invalid), False


# field -> generator(rng, ctx) -> (json text, valid?)

def f_command(rng, ctx):
    roll = rng.random()
    if roll < 0.6:
        return dumps(rng, "echo " + some_text(rng)), True
    if roll < 0.65:
        return json.dumps("x" * q.MAX_COMMAND_BYTES), True
    if roll < 0.68:
        return json.dumps("é" * (q.MAX_COMMAND_BYTES // 2) + "x"), True  # 131,071 bytes exactly
    choice = rng.choice([
        '""', '"   "', '"\\n\\t "', '"echo \\u0000"', '"\\ud800"', '"echo \\udfff hi"', "TOO_LONG", "TOO_LONG_UTF8",
        "5", "null", "[]", '["echo"]', "{}", "true", "1e309",
    ])
    if choice == "TOO_LONG":  # built only when drawn: big strings cost time
        choice = json.dumps("x" * (q.MAX_COMMAND_BYTES + 1))
    elif choice == "TOO_LONG_UTF8":
        choice = json.dumps("é" * (q.MAX_COMMAND_BYTES // 2 + 1))
    return choice, False


def f_id(rng, ctx):
    value, kind = id_value(rng)
    if kind == "invalid":
        return json.dumps(value), False
    ctx["id"], ctx["id_kind"] = value, kind
    return dumps(rng, value), True


def f_max_retries(rng, ctx):
    return number_texts(rng, 0, q.MAX_RETRIES_LIMIT, True)


def f_timeout(rng, ctx):
    return number_texts(rng, 0, MAX_SECONDS, False, duration=True)


def f_priority(rng, ctx):
    return number_texts(rng, -q.MAX_PRIORITY, q.MAX_PRIORITY, True)


def f_delay(rng, ctx):
    return number_texts(rng, 0, MAX_SECONDS, False, duration=True)


def f_cwd(rng, ctx):
    return rng.choice([('"/"', True), ('"/tmp"', True), (dumps(rng, "/nonexistent/é 😀"), True),
                       ('"/a\\nb"', True), ('""', False), ('"relative"', False), ('"./x"', False),
                       ('"/a\\u0000b"', False), ('"\\udfff"', False), ("5", False), ("null", False), ("[]", False)])


def f_env(rng, ctx):
    text, ok = rng.choice([
        ("{}", True), ('{"A": "1"}', True), (dumps(rng, {"É": "ü", "B": "", "PATH": "/x"}), True),
        (dumps(rng, {"K": "\u2028 \x85 \t\n"}), True), ("BIG", True),
        ("[]", False), ('"A=1"', False), ('{"": "v"}', False), ('{"A=B": "v"}', False), ('{"A": 1}', False),
        ('{"A": null}', False), ('{"A\\u0000": "v"}', False), ('{"A": "\\u0000"}', False),
        ('{"\\ud800": "x"}', False), ('{"A": "\\udc00"}', False), ('{"A": {"B": "c"}}', False),
        ('{"A": ["x"]}', False), ("null", False),
    ])
    return ('{"A": "' + "v" * 100_000 + '"}' if text == "BIG" else text), ok


def f_queue(rng, ctx):
    return rng.choice([('"default"', True), ('"q.1-_"', True), (json.dumps("Q" * 64), True), ('""', False),
                       (json.dumps("Q" * 65), False), ('"a b"', False), ('"é"', False), ('"*"', False),
                       ('"a/b"', False), ("5", False), ("null", False), ('"a\\u0000"', False)])


def f_run_at(rng, ctx):
    return rng.choice([
        ('"2030-01-01T00:00:00"', True), ('"2030-01-01T00:00:00+02:00"', True), ('"2030-01-01"', True),
        ('"2030-01-01T00:00:00Z"', True), ("0", True), ("1700000000", True), ("1700000000.5", True),
        (str(MAX_UNIX_TIME), True), ("-0", True), ("1e-400", True),
        ('"not a date"', False), ('"2030-13-01"', False), ('"0001-01-01T00:00:00+00:00"', False), ("-1", False),
        (str(MAX_UNIX_TIME + 1), False), ("true", False), ("1e309", False), ("[]", False), ('""', False),
        ('"\\ud800"', False), ('"2030-01-01\\u0000"', False), (str(10 ** 400), False), ("null", False),
    ])


def f_depends_on(rng, ctx):
    roll = rng.random()
    earlier = ctx.get("batch_ids", [])
    if roll < 0.3:
        return "[]", True
    if roll < 0.55:
        deps = rng.sample(sorted(EXISTING), rng.randint(1, 3))
        return dumps(rng, deps + deps[:1]), True  # a repeated dependency counts once
    if roll < 0.65 and earlier:  # a job earlier in the same batch
        return dumps(rng, [rng.choice(earlier)]), True
    if roll < 0.75:  # a job that does not exist
        return dumps(rng, [valid_id_text(rng)]), True
    if roll < 0.8:
        ctx["self_dep"] = True
        return None, True  # filled in with the job's own id once it is known
    choice = rng.choice(['"pend"', "[5]", '[""]', '[["pend"]]', "null", "{}", "TOO_MANY", '["a\\nb"]', '["\\ud800"]'])
    return (json.dumps(["x"] * 1001) if choice == "TOO_MANY" else choice), False


FIELDS = {"command": f_command, "id": f_id, "max_retries": f_max_retries, "timeout": f_timeout, "cwd": f_cwd,
          "env": f_env, "priority": f_priority, "queue": f_queue, "run_at": f_run_at, "delay": f_delay,
          "depends_on": f_depends_on}


# ==== jobs: JSON text and the verdict the rules give ==================================================

class JobCase:
    """One generated job: its JSON text and what it should come to."""

    def __init__(self, text: str, valid: bool, job_id: str | None = None, id_kind: str | None = None,
                 either: bool = False):
        self.text, self.valid, self.id, self.id_kind = text, valid, job_id, id_kind
        self.either = either  # the rules do not settle it (a byte order mark): 0 or 2


def gen_job(rng: random.Random, batch_ids: list[str] | None = None, want_valid: float = 0.3) -> JobCase:
    """A job object built field by field (each value valid or not), or a hostile non-job; with
    probability want_valid, one that passes validation (retried until it does)."""
    if rng.random() < want_valid:
        for _ in range(50):
            job = _gen_job(rng, batch_ids)
            if job.valid:
                return job
    return _gen_job(rng, batch_ids)


def _gen_job(rng: random.Random, batch_ids: list[str] | None) -> JobCase:
    roll = rng.random()
    if roll < 0.12:
        return gen_garbage(rng, in_lines=batch_ids is not None)
    ctx: dict = {"batch_ids": batch_ids or []}
    names = [n for n in FIELDS if n != "command" and rng.random() < 0.3]
    if rng.random() < 0.95:
        names.append("command")
    rng.shuffle(names)
    pairs, valid = [], "command" in names
    for name in names:
        text, ok = FIELDS[name](rng, ctx)
        pairs.append([name, text])
        valid = valid and ok
    if "run_at" in names and "delay" in names:
        valid = False
    if ctx.get("self_dep"):
        own = ctx.get("id")
        if own is None or "id" not in names:  # no id to depend on: a missing dependency instead
            own = valid_id_text(rng)
        next(p for p in pairs if p[0] == "depends_on")[1] = dumps(rng, [own])
    roll = rng.random()
    if roll < 0.05:
        pairs.append([rng.choice(["max_retry", "Command", "__proto__", "id ", "", "a\u0000", "\ud800"]), "1"])
        valid = False
    elif roll < 0.09 and pairs:
        pairs.append(list(rng.choice(pairs)))  # a duplicate key
        valid = False
    text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"
    return JobCase(text, valid, ctx.get("id"), ctx.get("id_kind"))


def gen_garbage(rng: random.Random, in_lines: bool = False) -> JobCase:
    """Not a job object at all, or not JSON (in_lines: it must stay one non-blank line of a batch)."""
    base = '{"command": "echo hi"}'
    choice = rng.randrange(14)
    if choice == 0:
        text = rng.choice(["[]", '"x"', "5", "null", "true", "{}", '[{"command": "echo"}]', "-0", "1e309", "NaN"]
                          + ([] if in_lines else ["", " "]))  # a blank line in a batch is skipped, not an item
    elif choice == 1:
        text = base[:rng.randint(1, len(base) - 1)]  # truncated
    elif choice == 2:
        text = base + rng.choice(["x", "}", ",", " {}", "\x00", "//c"])  # trailing text
    elif choice == 3:
        depth = rng.choice([100, 5000, 100_000])
        text = '{"command": "x", "env": ' + "[" * depth + "]" * depth + "}"
    elif choice == 4:
        depth = rng.choice([100, 5000, 100_000])
        text = '{"a": ' * depth + "1" + "}" * depth
    elif choice == 5:
        text = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randint(0, 40)))
        if in_lines:
            text = "x" + "".join(text.splitlines())
    elif choice == 6:
        text = "{'command': 'echo'}"
    elif choice == 7:
        text = '{"command": "echo", /* c */ "id": "x"}'
    elif choice == 8:
        text = '{"command": "echo\x01"}'  # a raw control character in a string
    elif choice == 9:
        text = '{"command": "echo \\x41"}'  # an invalid escape
    elif choice == 10:
        text = '{"command": "echo", "max_retries": 0' + "0" * rng.randint(1, 3) + "}"  # leading zeros
    elif choice == 11:
        text = '{"command": "echo", "timeout": .5}'
    elif choice == 12:
        text = "\ufeff" + base  # a byte order mark
        return JobCase(text, False, either=True)
    else:
        text = "\u3000" + base + "\u3000"  # non-JSON whitespace
    return JobCase(text, False)


def id_and_deps(job: JobCase) -> tuple[str | None, list[str]]:
    """The id (None: generated) and dependencies of a valid job."""
    obj = json.loads(job.text)
    return obj.get("id"), obj.get("depends_on", [])


def job_verdict(job: JobCase) -> set[int]:
    """Exit codes the rules allow for one `enqueue JSON`: invalid -> 2; the id taken, or a dependency
    missing or dead -> 1 (a single job's self-dependency is a missing dependency, DECISIONS.md)."""
    if job.either:
        return {0, 2}
    if not job.valid:
        return INVALID
    job_id, deps = id_and_deps(job)
    if job_id in EXISTING or any(EXISTING.get(d, "dead") == "dead" for d in deps):
        return IMPOSSIBLE
    return OK


# ==== cases ===========================================================================================

class Case:
    """argv after --db, stdin bytes (or None), the exit codes allowed, and jobs an accepted run adds."""

    def __init__(self, kind: str, argv: list[str], expect: set[int], stdin: bytes | None = None, adds: int = 0):
        self.kind, self.argv, self.expect, self.stdin, self.adds = kind, argv, expect, stdin, adds


def case_enqueue(rng: random.Random) -> Case:
    job = gen_job(rng)
    text = job.text
    if rng.random() < 0.1:
        text = rng.choice([" ", "\n", "\t", "\r\n"]) + text + rng.choice([" ", "\n", ""])
    argv = ["enqueue", text] + (["--json"] if rng.random() < 0.2 else [])
    return Case("enqueue", argv, job_verdict(job), adds=1)


def case_batch(rng: random.Random) -> Case:
    """`enqueue -` with JSON Lines or a JSON array on stdin."""
    n = rng.choice([0, 1, 2, 3, 5, 20])
    jobs: list[JobCase] = []
    ids: list[str] = []
    want_valid = rng.choice([0.3, 0.97, 1.0])
    for _ in range(n):
        job = gen_job(rng, list(ids), want_valid)
        jobs.append(job)
        if job.valid and job.id_kind == "new" and job.id is not None:
            ids.append(job.id)
    if jobs and rng.random() < 0.08:  # a duplicate id inside the batch
        twin = next((j for j in jobs if j.valid and j.id_kind == "new"), None)
        if twin is not None:
            jobs.append(JobCase(twin.text, True, twin.id, "dup"))
    as_array = rng.random() < 0.3
    if as_array:
        body = rng.choice(["", " ", "\n"]) + "[" + rng.choice([",", ", ", ",\n"]).join(j.text for j in jobs) + "]"
    else:
        sep = rng.choice(["\n", "\r\n"])
        lines = []
        for j in jobs:
            lines.append(j.text)
            if rng.random() < 0.15:
                lines.append(rng.choice(["", "   ", "\t"]))
        body = sep.join(lines) + rng.choice(["", sep])
    data = body.encode("utf-8", "surrogatepass")
    expect = batch_verdict(jobs, as_array)
    roll = rng.random()
    if roll < 0.1:  # invalid UTF-8 somewhere
        at = rng.randint(0, len(data))
        data = data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80"]) + data[at:]
        expect = INVALID
    elif roll < 0.13 and not as_array:  # a huge first line: read whole, then refused (an env string over 131,071 bytes)
        data = b'{"command": "echo big", "env": {"X": "' + b"y" * rng.choice([1 << 20, 4 << 20]) + b'"}}\n' + data
        expect = INVALID
    elif roll < 0.16:
        data = rng.choice([b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b"\x00" * 10, b"{" * 50_000,
                           bytes(rng.randrange(256) for _ in range(200))])
        expect = INVALID
    return Case("enqueue -", ["enqueue", "-"] + (["--json"] if rng.random() < 0.2 else []), expect, data,
                adds=n if expect == OK else 0)


def batch_verdict(jobs: list[JobCase], as_array: bool) -> set[int]:
    """Exit codes the rules allow for a batch: an invalid item -> 2; an id twice in the batch, or a
    dependency on a job of the batch that does not come earlier -> 2; then an id taken or a
    dependency missing or dead -> 1."""
    if any(j.either for j in jobs):
        return {0, 1, 2}
    if any(not j.valid for j in jobs):
        return INVALID
    parsed = [id_and_deps(j) for j in jobs]
    in_batch = {job_id for job_id, _ in parsed if job_id is not None}
    seen: set[str] = set()
    impossible = False
    for job_id, deps in parsed:
        if job_id in seen or any(d in in_batch and d not in seen for d in deps):
            return INVALID
        impossible = impossible or job_id in EXISTING or any(
            d not in seen and EXISTING.get(d, "dead") == "dead" for d in deps)
        if job_id is not None:
            seen.add(job_id)
    return IMPOSSIBLE if impossible else OK


def hostile_id(rng: random.Random, option_like: bool = True) -> tuple[str, str]:
    """(id as a command-line string, kind): existing, new (missing), invalid, or option-like."""
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(sorted(EXISTING)), "existing"
    if roll < 0.6:
        return valid_id_text(rng), "missing"
    if roll < 0.9 or not option_like:
        value = invalid_id_value(rng)
        return (value if isinstance(value, str) else json.dumps(value)), ("invalid" if isinstance(value, str)
                                                                         else "missing")
    return rng.choice(["-x", "-1", "- a", "-"]), "option"


def case_ids(rng: random.Random) -> Case:
    command = rng.choice(["show", "logs", "cancel", "delete", "dlq retry", "wait"])
    many = command in ("cancel", "delete", "dlq retry", "wait")
    count = rng.choice([1, 1, 2, 3]) if many else 1
    picks = [hostile_id(rng, option_like=command not in ("logs", "wait")) for _ in range(count)]
    if many and rng.random() < 0.3:  # the sets that succeed together
        picks = [(i, "existing") for i in rng.choice([["pend", "child"], ["dead1", "dead2"], ["dead2", "dead1"],
                                                      ["done", "done"], ["pend", "fail", "proc"]])]
    ids = [p[0] for p in picks]
    extra: list[str] = []
    if command == "logs" and rng.random() < 0.5:
        run_arg = rng.choice(["1", "2", "0", "-1", str(2 ** 62), str(2 ** 62 + 1), "1e3", "x", "", "١", " 1"])
        extra = ["--run", run_arg]
    if command == "wait":
        extra = ["--timeout", rng.choice(["0", "0", "0", "-0", "1e-9", "-1", "nan", "1e309", "x", ""])]
    if command in ("show",) and rng.random() < 0.3:
        extra = ["--json"]
    argv = command.split() + ids + extra
    return Case(command, argv, ids_verdict(command, picks, extra))


def duration_ok(text: str, low: float, high: float) -> bool:
    """The duration rule, written out again: digits, an optional fraction, at most one unit."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhdw]?)", text.strip())
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return bool(match) and low <= float(match[1]) * units[match[2]] <= high


def ids_verdict(command: str, picks: list[tuple[str, str]], extra: list[str]) -> set[int]:
    """What the rules give for an id-taking command on the starting database."""
    if any(kind == "option" for _, kind in picks):
        return {1, 2}  # argparse may read it as an option (2) or as a positional id that does not exist (1)
    if any(kind == "invalid" for _, kind in picks):
        return INVALID
    if extra[:1] == ["--timeout"] and not duration_ok(extra[1], 0, MAX_SECONDS):
        return INVALID
    if extra[:1] == ["--run"]:
        if not re.fullmatch(r"\s*-?[0-9]+\s*", extra[1], re.ASCII) or not 1 <= int(extra[1]) <= 2 ** 62:
            return INVALID
    ids = list(dict.fromkeys(i for i, _ in picks))
    if any(i not in EXISTING for i in ids):
        return IMPOSSIBLE
    state = EXISTING
    if command in ("show",):
        return OK
    if command == "logs":
        if extra[:1] == ["--run"] and (int(extra[1]) != 1 or ids[0] not in WITH_RUNS):
            return IMPOSSIBLE
        return OK
    if command == "cancel":
        return IMPOSSIBLE if any(state[i] in ("completed", "dead") for i in ids) else OK
    if command == "delete":
        if any(state[i] == "processing" for i in ids):
            return IMPOSSIBLE
        # A job that has not completed stays while a job depending on it has not completed (a dead
        # dependent counts: `dlq retry` may revive it), unless both go in the same call.
        needed = any(dep in ids and child not in ids and state[child] != "completed" and state[dep] != "completed"
                     for child, deps in DEPENDS.items() for dep in deps)
        return IMPOSSIBLE if needed else OK
    if command == "dlq retry":
        if any(state[i] != "dead" for i in ids):
            return IMPOSSIBLE
        blocked = any(i in DEPENDS and any(state[d] == "dead" and d not in ids for d in DEPENDS[i]) for i in ids)
        return IMPOSSIBLE if blocked else OK
    if command == "wait":
        return OK if all(state[i] == "completed" for i in ids) else IMPOSSIBLE
    raise AssertionError(command)


CONFIG_VALUES = {
    # key: (valid values, invalid values)
    # numbers: ASCII digits, an optional '-', a '.fraction' where allowed; blanks around; nothing else
    "max-retries": (["0", "3", "1000000", "-0", " 7 ", "0003"],
                    ["-1", "1000001", "1.5", "3.0", "1e2", "nan", "", "x", "0x10", "1_0", "9" * 5000, "1" * 30, "9" * 400,
                     "-" + "9" * 400, "+5", "３"]),
    "backoff-base": (["1", "2", "1.5", "1000", "1000.0", " 2 "],
                     ["0.5", "0", "-2", "1001", "nan", "inf", "-inf", "1e309", "", "two", "1e-400", "1e3", "1E0", "+2",
                      "1000.0000001"]),
    # the keys in seconds take a duration: digits, at most one unit (s m h d w), no sign, no exponent
    "backoff-max": (["0", "60", "0.25", str(MAX_SECONDS), "1h", "1w"],
                    ["-1", "-0", str(MAX_SECONDS + 1), "nan", "Infinity", "1e309", "", "1e-300", "1H"]),
    "stale-timeout": (["10", "1", "86400", "2.5", "10s", "1d"],
                      ["0", "-0", "-1", "86401", "nan", "", "0.001", "1e-9", "0.999", "1_0", "1e0", "2d"]),
    "job-timeout": (["0", "30", str(MAX_SECONDS), "2.5", "15m"], ["-1", str(MAX_SECONDS + 1), "nan", "1e309", ""]),
    "retention": (["7d", "30s", "0", "1.5h", "15m", "3650d", "12", " 7d ", "1w"],
                  ["-1", "99999d", "7 d", "", "d", "1e3", "nan", "inf", "1.d", "\x00"]),
}


def case_config(rng: random.Random) -> Case:
    key = rng.choice(sorted(CONFIG_VALUES))
    good, bad = CONFIG_VALUES[key]
    roll = rng.random()
    if roll < 0.4:
        value, expect = rng.choice(good), OK
    elif roll < 0.8:
        value, expect = rng.choice(bad), INVALID
    else:
        value = rng.choice(["1\x00", "\ud800", "١٢", "1_000", "\u00b2", "৩", " ", "\t5\n", "+inf", "0b1", "1e-400",
                            "9" * 400 + ".0", "-" + "9" * 400])
        expect = {0, 2}
    if rng.random() < 0.5:
        key = key.replace("-", "_")
    if rng.random() < 0.08:
        key, expect = rng.choice(["max-retry", "", "MAX_RETRIES", "retries", "\ud800", "stale-timeout\x00",
                                  "backoff--base", "-x"]), INVALID
    return Case("config set", ["config", "set", key, value], expect)


def case_view(rng: random.Random) -> Case:
    """Read-only commands with hostile options (only their validity matters)."""
    choice = rng.randrange(4)
    if choice == 0:
        state = rng.choice([None, "pending", "dead", "PENDING", "x", "", "\ud800", "processing\x00"])
        limit = rng.choice([None, "0", "5", "-1", str(2 ** 62), str(2 ** 62 + 1), "1e3", "x"])
        queue = rng.choice([None, "default", "", "a b", "Q" * 65, "\ud800"])
        argv, expect = ["list"], OK
        if state is not None:
            argv += ["--state", state]
            expect = expect if state in q.STATES else INVALID
        if limit is not None:
            argv += ["--limit", limit]
            ok = re.fullmatch(r"-?\d+", limit) and 0 <= int(limit) <= 2 ** 62
            expect = expect if ok else INVALID
        if queue is not None:
            argv += ["--queue", queue]
            expect = expect if re.fullmatch(r"[A-Za-z0-9._-]{1,64}", queue) else INVALID
        return Case("list", argv + (["--json"] if rng.random() < 0.5 else []), expect)
    if choice == 1:
        queue = rng.choice(["default", "", "x" * 65, "é", "a.b"])
        ok = re.fullmatch(r"[A-Za-z0-9._-]{1,64}", queue)
        return Case("status", ["status", "--queue", queue, "--json"], OK if ok else INVALID)
    if choice == 2:
        key = rng.choice(["max-retries", "retention", "stale_timeout", "nope", "", "\ud800"])
        return Case("config get", ["config", "get", key],
                    OK if key.replace("_", "-") in CONFIG_VALUES else INVALID)
    return Case("list", ["list", rng.choice(["--bogus", "--state", "--limit"])], INVALID)


GENERATORS = [(30, case_enqueue), (25, case_batch), (15, case_config), (25, case_ids), (5, case_view)]


def make_case(seed: int, n: int) -> Case:
    """Case number n of a seed; depends on nothing else, so it replays exactly."""
    rng = random.Random(f"{seed}:{n}")
    pick = rng.random() * sum(w for w, _ in GENERATORS)
    for weight, gen in GENERATORS:
        pick -= weight
        if pick < 0:
            return gen(rng)
    return GENERATORS[-1][1](rng)


# ==== running a case in this process ==================================================================

class FakeStdin:
    """sys.stdin for main(): `enqueue -` reads sys.stdin.buffer.read()."""

    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)

    def read(self) -> str:
        return self.buffer.read().decode("utf-8", "surrogateescape")

    def isatty(self) -> bool:  # a pipe: `enqueue -` says nothing about typing jobs
        return False


class Sandbox:
    """A temporary database with one job in each state; restored whenever a case changed it."""

    def __init__(self):
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="queuectl-fuzz-", dir=base)
        self.path = os.path.join(self.dir, "fuzz.db")
        build_start_state(self.path)
        with open(self.path, "rb") as f:
            self.pristine = f.read()
        self.pristine_print = self.fingerprint()

    def fingerprint(self) -> str:
        """A digest of every table's rows (a logical dump: what a user could see change)."""
        conn = sqlite3.connect(self.path)
        try:
            digest = hashlib.sha256()
            for table in TABLES:
                for row in conn.execute(f"SELECT * FROM {table}"):
                    digest.update(repr(row).encode("utf-8", "surrogatepass"))
                digest.update(b"|")
            return digest.hexdigest()
        finally:
            conn.close()

    def count_jobs(self) -> int:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        finally:
            conn.close()

    def restore(self) -> None:
        for suffix in ("-wal", "-shm"):
            try:
                os.unlink(self.path + suffix)
            except FileNotFoundError:
                pass
        with open(self.path, "wb") as f:
            f.write(self.pristine)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def with_schema(server: str, schema: str) -> str:
    """The server's URL naming `schema` (any schema= it had is replaced)."""
    parts = urlsplit(server)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query + [("schema", schema)])))


class PgSandbox(Sandbox):
    """The same starting database in a fresh schema of a PostgreSQL server; a Store on it reads the
    dump and puts the starting rows back. close() drops the schema."""
    SEQUENCES = (("jobs", "seq"), ("deps", "seq"))

    def __init__(self, server: str):
        self.dir = None
        self.path = with_schema(server, f"fuzz_{uuid.uuid4().hex}")
        self.store = None
        try:
            build_start_state(self.path)
            self.store = q.open_database(self.path)
            self.pristine_rows = {table.split()[0]: self.store.read(f"SELECT * FROM {table}") for table in TABLES}
            self.pristine_seqs = []
            for table, column in self.SEQUENCES:
                name = self.store.read("SELECT pg_get_serial_sequence(%s, %s)", (table, column))[0][0]
                last, called = self.store.read(f"SELECT last_value, is_called FROM {name}")[0]
                self.pristine_seqs.append((name, last, called))
            self.pristine_print = self.fingerprint()
        except BaseException:
            self.close()
            raise

    def rows(self, sql: str) -> list[tuple]:
        return self.store.read(sql)

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for table in TABLES:
            for row in self.store.read(f"SELECT * FROM {table}"):
                digest.update(repr(row).encode("utf-8", "surrogatepass"))
            digest.update(b"|")
        return digest.hexdigest()

    def count_jobs(self) -> int:
        return self.store.read("SELECT count(*) FROM jobs")[0][0]

    def restore(self) -> None:
        def put_back(cur):
            cur.execute("TRUNCATE " + ", ".join(self.pristine_rows))
            for table, rows in self.pristine_rows.items():
                if rows:
                    marks = ", ".join(["%s"] * len(rows[0]))
                    cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
            for name, last, called in self.pristine_seqs:
                cur.execute("SELECT setval(%s, %s, %s)", (name, last, called))
        self.store.write(put_back)

    def close(self) -> None:
        import psycopg
        from psycopg import sql as pgsql
        if self.store is not None:
            self.store.close()
        schema = dict(parse_qsl(urlsplit(self.path).query))["schema"]
        libpq_url = q._pg_target(self.path)[0]  # the URL without queuectl's schema= parameter
        with psycopg.connect(libpq_url, autocommit=True, connect_timeout=30) as conn:
            conn.execute("SET lock_timeout = '30s'")  # a leftover session holding a lock fails loudly
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))


def build_start_state(path: str) -> None:
    """pend, 'ünï-code 😀', child (waits on pend): pending; done: completed; dead1: dead; dead2: dead
    (its dependency is); fail: failed, retrying later; proc: processing on a registered remote worker."""
    store = q.open_database(path)  # an SQLite file, or a PostgreSQL URL with its schema
    now = time.time()
    defaults = store.config_all()

    def add(job_id: str, **extra):
        store.enqueue([q.validate_job({"id": job_id, "command": f"echo {job_id}", **extra}, defaults, "/", now)], now)

    worker = "fuzz-host:1:remote"
    store.register(worker, {"host": "fuzz-host", "pid": 1, "proc_start": "1", "boot_id": "b", "pid_ns": "n"}, 1, now)

    def settle(job_id: str, code: int):
        """Claim the job (the only one due) and finish it with exit `code` (< 0: leave it running)."""
        job = store.claim(worker, now)
        assert job.id == job_id, job
        if code >= 0:
            store.finish(job, worker, q.Outcome(code, None if code == 0 else f"exit code {code}", b"out\n", 0.1),
                         store.config_all(), now)

    def run(job_id: str, code: int, **extra):
        add(job_id, **extra)
        settle(job_id, code)
    run("done", 0)
    add("dead1", max_retries=1)
    add("dead2", depends_on=["dead1"])  # before dead1 dies: a job on a dead dependency is refused
    settle("dead1", 1)
    run("fail", 1, max_retries=3)
    run("proc", -1)
    add("pend")
    add("ünï-code 😀")
    add("child", depends_on=["pend"])
    store.pause(["paused-q"])
    store.config_set("backoff_base", 3)
    got = {job.id: job.state for job in store.list_jobs()}
    assert got == EXISTING, got
    store.close()


def run_main(argv: list[str], stdin: bytes | None, encoding: str) -> tuple[int | None, bytes, bytes, str | None]:
    """queuectl.main(argv) with our streams; (exit code, stdout, stderr, escaped exception or None)."""
    saved = sys.stdin, sys.stdout, sys.stderr
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdout = io.TextIOWrapper(out, encoding=encoding, errors="strict", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding=encoding, errors="strict", write_through=True)
    sys.stdin = FakeStdin(stdin if stdin is not None else b"")
    escaped = None
    code = None
    try:
        code = q.main(argv)
    except BaseException as e:  # noqa: BLE001 - anything escaping main() is a failure to report
        import traceback
        escaped = "".join(traceback.format_exception(e))
    finally:
        wrappers = (sys.stdout, sys.stderr)  # main() may have replaced them (a broken pipe)
        for stream in wrappers:
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        sys.stdin, sys.stdout, sys.stderr = saved
        captured = out.getvalue(), err.getvalue()  # before the wrappers are collected (closing the buffers)
        del wrappers
    return code, captured[0], captured[1], escaped


def check_case(box: Sandbox, case: Case, encoding: str) -> tuple[int | None, list[str]]:
    """Run one case on the pristine database; (exit code, the rules it broke)."""
    before_jobs = len(EXISTING)
    code, out, err, escaped = run_main(["--db", box.path] + case.argv, case.stdin, encoding)
    after = box.fingerprint()
    changed = after != box.pristine_print
    problems = []
    if escaped:
        problems.append(f"exception escaped main():\n{escaped}")
    else:
        if code not in (0, 1, 2):
            problems.append(f"exit code {code!r} is not 0, 1 or 2")
        elif code not in case.expect:
            problems.append(f"exit code {code}, the rules give {sorted(case.expect)}")
    text_err = err.decode(encoding, "replace")
    if "Traceback" in text_err:
        problems.append("stderr holds a traceback")
    if code not in (0, None) and not text_err.startswith("queuectl: error: "):
        problems.append("a failure without a 'queuectl: error:' line")
    if code not in (0, None) and changed:
        problems.append(f"exit code {code} but the database changed")
    if case.kind in READ_ONLY and changed:
        problems.append(f"read-only command {case.kind!r} changed the database")
    if code == 0 and case.kind.startswith("enqueue") and case.expect == OK:
        printed = len(out.split(b"\n")) - 1 if "--json" not in case.argv else None
        added = box.count_jobs() - before_jobs
        if added != case.adds or (printed is not None and printed != case.adds):
            problems.append(f"accepted enqueue of {case.adds} jobs stored {added}, printed {printed} ids")
    if problems:
        problems.append(f"stdout: {out[:300]!r}\n    stderr: {err[:500]!r}")
    if changed:
        box.restore()
    return code, problems


def describe(case: Case, seed: int, n: int, encoding: str, pg: str | None = None) -> str:
    """The exact input of a case, to reproduce it by hand or with --case."""
    stdin = case.stdin
    shown = repr(stdin if stdin is None or len(stdin) <= 2000 else stdin[:2000]) + (
        f" ... ({len(stdin)} bytes in all)" if stdin is not None and len(stdin) > 2000 else "")
    argv = repr(case.argv) if len(repr(case.argv)) <= 3000 else repr(case.argv)[:3000] + " ...(truncated)"
    return (f"case {n} of seed {seed} ({case.kind}, stdout encoding {encoding}):\n"
            f"    argv after --db DB: {argv}\n    stdin: {shown}\n"
            f"    replay: python3 bench/fuzz.py --seed {seed} --case {n}" + (f" --pg {redacted(pg)}" if pg else ""))


def redacted(url: str) -> str:
    """A server URL as messages show it: without its password (as queuectl names a database)."""
    return q.database_name(url)


def run(cases: int, seed: int, *, first: int = 0, verbose: bool = False, pg: str | None = None) -> dict:
    """Run `cases` cases of `seed` (pg: on that PostgreSQL server); returns counts (by kind and exit
    code) and the failures."""
    box = PgSandbox(pg) if pg else Sandbox()
    result: dict = {"cases": 0, "by_kind": {}, "exit_codes": {0: 0, 1: 0, 2: 0}, "failures": []}
    # Ctrl-C mostly lands inside main(), which turns it into exit 130: noted here, it ends the run
    # after that case (and close() still removes the database: a PostgreSQL schema is dropped).
    import signal
    interrupted: list = []

    def on_sigint(signum, frame):
        interrupted.append(signum)
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, on_sigint) if signal.getsignal(signal.SIGINT) is signal.default_int_handler else None
    try:
        for n in range(first, first + cases):
            if interrupted:
                raise KeyboardInterrupt
            case = make_case(seed, n)
            encoding = "ascii" if random.Random(f"enc:{seed}:{n}").random() < 0.15 else "utf-8"
            code, problems = check_case(box, case, encoding)
            result["cases"] += 1
            result["exit_codes"][code] = result["exit_codes"].get(code, 0) + 1
            result["by_kind"][case.kind] = result["by_kind"].get(case.kind, 0) + 1
            if problems:
                result["failures"].append(describe(case, seed, n, encoding, pg) + "\n    " + "\n    ".join(problems))
                if verbose:
                    print(result["failures"][-1], file=sys.stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        box.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=5000, help="how many cases (default 5000)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--case", type=int, help="replay only this case number")
    p.add_argument("--short", action="store_true",
                   help="the bounded run of `make test` (1500 cases; 600 with --pg, where a case costs 2-3 times more)")
    p.add_argument("--max-failures", type=int, default=20, help="print at most this many failures (default 20)")
    p.add_argument("--pg", metavar="URL", help="run on this PostgreSQL server (postgresql://USER@HOST:PORT/DB), "
                   "in a fresh schema fuzz_<hex> dropped at the end; needs psycopg 3")
    args = p.parse_args(argv)
    if args.pg is not None and not q.is_postgres(args.pg):
        p.error("--pg takes a postgresql:// URL")
    if args.short:
        args.cases = 600 if args.pg else 1500
    started = time.monotonic()
    if args.case is not None:
        result = run(1, args.seed, first=args.case, pg=args.pg)
    else:
        result = run(args.cases, args.seed, pg=args.pg)
    took = time.monotonic() - started
    for failure in result["failures"][:args.max_failures]:
        print(f"fuzz: FAILED: {failure}\n", file=sys.stderr)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(result["by_kind"].items()))
    codes = ", ".join(f"exit {k}: {v}" for k, v in result["exit_codes"].items() if v)
    where = " on PostgreSQL" if args.pg else ""
    print(f"fuzz: {result['cases']} cases (seed {args.seed}){where} in {took:.1f}s: {kinds}; {codes}; "
          f"{len(result['failures'])} failed")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
