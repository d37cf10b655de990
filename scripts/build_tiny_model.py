"""Build a tiny random-weight Llama model directory that vLLM can serve, with no model hub.

Run with the vLLM virtualenv's Python (it needs torch, transformers and tokenizers):

    python scripts/build_tiny_model.py --out DIR

What it writes:
- a byte-level BPE tokenizer trained with ``tokenizers`` on this Python's own standard-library sources (local,
  deterministic for a given Python version), with special tokens and a ChatML chat template stored in
  ``tokenizer_config.json``;
- a ``LlamaForCausalLM`` with seeded random weights (4 layers, hidden 384), saved as safetensors.

The model produces nonsense, which is all the tier needs: real prefill/decode cost, real paged KV cache,
real prefix caching. Deterministic: the same Python and library versions give the same files.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(max_bytes: int) -> Iterator[str]:
    """The standard library's .py files in sorted order, up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text)
        yield text
        if total >= max_bytes:
            return


def build_tokenizer(out: Path, vocab_size: int, corpus_bytes: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(corpus_bytes), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        model_max_length=1_000_000,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Keep the template inside tokenizer_config.json whatever this transformers version does by default.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def build_model(out: Path, vocab_size: int, args: argparse.Namespace) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(str(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--corpus-bytes", type=int, default=8_000_000)
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--max-positions", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    build_tokenizer(out, args.vocab_size, args.corpus_bytes)
    t1 = time.monotonic()
    from transformers import PreTrainedTokenizerFast

    vocab_size = len(PreTrainedTokenizerFast.from_pretrained(str(out)))
    build_model(out, vocab_size, args)
    t2 = time.monotonic()
    print(f"tokenizer: {vocab_size} tokens in {t1 - t0:.1f} s; model: {t2 - t1:.1f} s; at {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
