"""`webctx research` against a running local service: the service submits what the command
hands it (webctx/api/inbox.py), with the same limits, idempotency and errors as when the
command submits by itself; real CLI processes, the real service, the loopback web."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import clean_env, run_cli, service_pid
from tests.testweb import LoopbackWeb
from webctx.devweb.searxng import searxng_control
from webctx.models import Bundle

QUESTION = "how do lithium-ion batteries degrade?"
SMALL = ("--max-sources", "4", "--token-budget", "600")


def _submitted_by_service(data_dir: Path) -> int:
    return (data_dir / "service.log").read_text().count("job submitted")


def test_research_with_a_service_running_is_submitted_by_it_and_prints_the_bundle(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    first = run_cli(env, "research", QUESTION, *SMALL, "--no-wait")  # starts the service
    assert first.returncode == 0, first.stderr[-3000:]
    assert service_pid(data_dir) is not None
    before = _submitted_by_service(data_dir)

    done = run_cli(env, "research", "does fast charging wear out a battery?", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Bundle.model_validate_json(done.stdout)
    assert bundle.chunks and bundle.sources
    assert _submitted_by_service(data_dir) == before + 1  # the service submitted it

    # The idempotency key holds across hand-overs: same key and request, same job; same
    # key, another request: refused, as the API refuses it.
    keyed = [run_cli(env, "research", QUESTION, *SMALL, "--no-wait", "--idempotency-key", "k1")
             for _ in range(2)]  # fmt: skip
    assert [k.returncode for k in keyed] == [0, 0]
    assert keyed[0].stdout.strip() == keyed[1].stdout.strip() != first.stdout.strip()
    other = run_cli(env, "research", "what is SEI growth?", *SMALL, "--no-wait",
                    "--idempotency-key", "k1")  # fmt: skip
    assert other.returncode == 1 and "Idempotency-Key already used" in other.stderr
    assert _submitted_by_service(data_dir) == before + 2
    # The service, its worker started, did not take itself for one with other settings
    # than its own (its worker writes CELERY_LOG_* into its environment).
    log = (data_dir / "service.log").read_text()
    assert "other settings" not in log
    # What the service loaded is out of its full collections (webctx.workers.app).
    assert "loaded objects left out of full collections" in log


def test_a_request_the_service_refuses_prints_the_commands_own_error(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    assert run_cli(env, "service", "start").returncode == 0
    handed = run_cli(env, "research", QUESTION, "--max-sources", "0", "--no-wait")
    # The same request refused by a command that submits by itself (a broker set: it
    # validates before it connects anywhere).
    itself = run_cli(clean_env(**test_web.env(), CELERY_BROKER_URL="redis://127.0.0.1:9/0"),
                     "research", QUESTION, "--max-sources", "0", "--no-wait")  # fmt: skip
    assert handed.returncode == itself.returncode == 2
    assert handed.stderr.strip().splitlines()[-1] == itself.stderr.strip().splitlines()[-1]
    assert "max_sources" in handed.stderr
    too_big = run_cli(env, "research", QUESTION, "--max-sources", "100000", "--no-wait")
    assert too_big.returncode in (1, 2) and "max_sources" in too_big.stderr
    # Words that do not parse: the service leaves them to the command's own parser.
    unparsed = run_cli(env, "research", QUESTION, "--max-sources", "many", "--no-wait")
    assert unparsed.returncode == 2 and unparsed.stderr.startswith("Usage:")
    assert _submitted_by_service(data_dir) == 0


HOSTILE = ("\x1b]0;owned\x07how do\x1b[2J\x1b[H lithium-ion batteries\x0c degrade?\x1bc"
           "\u202e\x9b31m\x1b]8;;http://127.0.0.2/\x1b\\ SEI\x1b]8;;\x1b\\")  # fmt: skip


def test_a_questions_control_sequences_reach_neither_the_terminal_nor_the_search_engine(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    assert run_cli(env, "service", "start").returncode == 0
    queries = searxng_control(test_web.search.app).queries
    before = len(queries)
    done = run_cli(env, "research", HOSTILE, *SMALL, "--format", "markdown")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _submitted_by_service(data_dir) == 1  # the handed words were cleaned too
    sent = queries[before:]
    assert sent and all(q.isprintable() for q in sent), sent
    assert done.stdout.startswith("# how do lithium-ion batteries degrade? SEI\n")
    for output in (done.stdout, done.stderr):
        assert not any(c in output for c in "\x1b\x07\x0c\x9b\u202e"), output[:500]


def test_a_domain_that_is_not_a_host_name_is_a_usage_error_naming_it(
    test_web: LoopbackWeb, data_dir: Path
) -> None:
    env = clean_env(**test_web.env())
    assert run_cli(env, "service", "start").returncode == 0
    itself = clean_env(**test_web.env(), CELERY_BROKER_URL="redis://127.0.0.1:9/0")
    for value in ("file:///etc/passwd", "javascript:alert(1)", "example.com:8080"):
        for how in (env, itself):  # handed to the service, and submitted by the command
            done = run_cli(how, "research", QUESTION, "--include-domain", value, "--no-wait")
            assert done.returncode == 2, done.stderr[-2000:]
            assert f"include_domains[0]: {value!r} is not a host name" in done.stderr
    assert _submitted_by_service(data_dir) == 0
    ok = run_cli(env, "research", QUESTION, "--include-domain", "Bücher.DE", "--no-wait")
    assert ok.returncode == 0, ok.stderr[-2000:]
