# queuectl: everything a user or CI runs. `make help` lists the targets.
PYTHON ?= python3
PREFIX ?= $(HOME)/.local
DEMO_DB ?= /tmp/queuectl-demo.db

.PHONY: help demo check test smoke install bench bench-tiny torture fuzz simulate

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

demo:  ## enqueue a few jobs (one failing), drain them with a burst worker, show status and the DLQ
	@rm -f $(DEMO_DB) $(DEMO_DB)-wal $(DEMO_DB)-shm
	$(PYTHON) queuectl.py --db $(DEMO_DB) config set backoff-base 1
	$(PYTHON) queuectl.py --db $(DEMO_DB) enqueue '{"id": "hello", "command": "echo hello from queuectl"}'
	$(PYTHON) queuectl.py --db $(DEMO_DB) enqueue '{"id": "date", "command": "date -u"}'
	$(PYTHON) queuectl.py --db $(DEMO_DB) enqueue '{"id": "broken", "command": "echo about to fail; exit 3", "max_retries": 2}'
	$(PYTHON) queuectl.py --db $(DEMO_DB) worker start --burst --count 2
	$(PYTHON) queuectl.py --db $(DEMO_DB) status
	$(PYTHON) queuectl.py --db $(DEMO_DB) dlq list
	$(PYTHON) queuectl.py --db $(DEMO_DB) logs hello

check:  ## the quick loop before every commit: the pytest suite on SQLite only (no PostgreSQL, fuzz, torture or benchmark)
	QUEUECTL_TEST_BACKENDS=sqlite $(PYTHON) -m pytest -q -k 'not postgres' test_queuectl.py

# With $QUEUECTL_TEST_PG (a PostgreSQL server's URL; .ci/run sets it), `test` runs the short fuzz and
# torture runs again on that server (about 30 s together). The URL is not echoed: it may hold a password.
test:  ## everything CI runs: pytest, the smoke test, short fuzz, simulation, torture and benchmark runs; fuzz and torture again on PostgreSQL if $QUEUECTL_TEST_PG is set
	$(PYTHON) -m pytest -q test_queuectl.py
	$(PYTHON) smoke_test.py
	$(PYTHON) bench/fuzz.py --short
	$(PYTHON) bench/simulate.py --short
	$(PYTHON) bench/torture.py --short
	$(PYTHON) bench/bench.py --tiny
	@if [ -n "$$QUEUECTL_TEST_PG" ]; then \
		echo '$(PYTHON) bench/fuzz.py --short --pg $$QUEUECTL_TEST_PG' && \
		$(PYTHON) bench/fuzz.py --short --pg "$$QUEUECTL_TEST_PG" && \
		echo '$(PYTHON) bench/torture.py --short --pg $$QUEUECTL_TEST_PG' && \
		$(PYTHON) bench/torture.py --short --pg "$$QUEUECTL_TEST_PG"; \
	else \
		echo "QUEUECTL_TEST_PG is not set: the PostgreSQL fuzz and torture runs are skipped"; \
	fi

smoke:  ## end-to-end smoke test with real worker processes
	$(PYTHON) smoke_test.py

bench:  ## run the performance benchmark (several minutes; prints a table, see bench/bench.py --help)
	$(PYTHON) bench/bench.py

bench-tiny:  ## the benchmark with a few jobs each (seconds), so it cannot rot; part of `make test`
	$(PYTHON) bench/bench.py --tiny

torture:  ## the long torture run: 10 minutes, a worker killed every 0.05-0.4 s (about 2,000 kills); no overlap, nothing lost
	$(PYTHON) bench/torture.py --seconds 600 --kill-every 0.05 0.4

fuzz:  ## 20,000 fuzzed hostile inputs: never a traceback, a rejected input changes nothing
	$(PYTHON) bench/fuzz.py --cases 20000

simulate:  ## deterministic simulation of the claim/heartbeat/sweep/recover protocol, 5,000 seeds
	$(PYTHON) bench/simulate.py --seeds 5000

install:  ## copy queuectl.py to $(PREFIX)/bin/queuectl
	install -d $(PREFIX)/bin
	install -m 0755 queuectl.py $(PREFIX)/bin/queuectl
