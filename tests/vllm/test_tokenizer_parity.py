"""The router's ``--tokenizer`` gives the ids vLLM's own tokenizer stack gives, on the tier's tiny Llama.

vLLM renders chats with transformers' ``apply_chat_template`` and encodes text with the HF tokenizer; the
vLLM environment's interpreter computes those ids for the same prompts, and the router's PromptTokenizer
(``tokenizers`` + jinja2, no transformers) must agree token for token. No server is needed.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from progrouter.routing.tokenize import PromptTokenizer

from .conftest import _env_paths

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

CHATS = [
    [{"role": "user", "content": "Hello, wörld! def f(x): return x * 2"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List three primes."},
        {"role": "assistant", "content": "2, 3, 5."},
        {"role": "user", "content": "  and   the next?\n"},
    ],
]
TEXTS = ["The quick brown fox", "  leading spaces, tabs\tand\nnewlines — ünïcödé 12345"]
REFERENCE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
data = json.loads(sys.stdin.read())
out = {"chats": [], "texts": [tok(t).input_ids for t in data["texts"]]}
for messages in data["chats"]:
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    out["chats"].append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
print(json.dumps(out))
"""


def test_router_tokenizer_matches_the_model_stack_vllm_uses() -> None:
    python, model = _env_paths()
    done = subprocess.run(
        [python, "-c", REFERENCE, model],
        input=json.dumps({"chats": CHATS, "texts": TEXTS}),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reference = json.loads(done.stdout.strip().splitlines()[-1])
    ours = PromptTokenizer.load(model)
    assert [ours.encode_text(t) for t in TEXTS] == reference["texts"]
    assert [ours.encode_chat(m) for m in CHATS] == reference["chats"]
