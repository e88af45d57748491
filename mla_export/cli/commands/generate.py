"""`mla-export generate OUT_DIR`: generate a continuation with the runtime (no torch).

Text is printed as it is generated (one flush per token: the engine's incremental
detokenizer gives each token's new text); `--json` prints one report at the end instead.
llama.cpp's spellings work as aliases (-p, -f/--file, -n/--n-predict, --temp, -t, -s, -m,
-cnv/--conversation, -st/--single-turn, -sys/--system-prompt); vLLM's --dtype maps to
--precision. A conversation of several turns is `mla-export chat` (cli/commands/chat.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from mla_export.cli.engine_flags import add_decode_graph_flags, decode_graph_kwargs

# vLLM's --dtype values -> the precision hint (no f16 compute on this CPU path).
DTYPES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "float32": "f32", "float": "f32", "f32": "f32"}


def dtype_arg(text: str) -> str:
    if text in DTYPES:
        return DTYPES[text]
    if text in ("float16", "half", "f16"):
        raise argparse.ArgumentTypeError("no f16 inference on the CPU path: use bfloat16 (bf16) or float32 (f32)")
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(DTYPES)}, got {text!r}")


def add_run_options(p, max_model_len_what: str) -> None:
    """The sampling and engine options `generate` and `chat` share (their own defaults stay theirs:
    -n/--max-tokens, the prompt options)."""
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("--precision", "--dtype", dest="precision", type=dtype_arg, default="bf16",
                   help="inference precision hint: bf16 (default) or f32; vLLM's --dtype values are accepted")
    p.add_argument("-t", "--threads", type=int, default=None, help="inference threads (default: the plugin's)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help=f"{max_model_len_what} (default: the model's context, or what the KV cache holds if less)")
    p.add_argument("--runtime", choices=("openvino", "onnxruntime"), default="openvino")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 4}' or '{\"method\": \"mtp\", "
                        "\"num_speculative_tokens\": 1}' (an export with an MTP draft; docs/SERVING.md)")
    from mla_export.cli.commands.verify import add_verify_flag

    add_verify_flag(p)
    add_decode_graph_flags(p)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate text from an exported model directory",
                              description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="a directory written by `mla-export export`")
    p.add_argument("-m", "--model", dest="model_opt", metavar="OUT_DIR", help="same as OUT_DIR (llama.cpp's spelling)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="prompt text (needs the model's tokenizer); with --chat, the user message")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated: 1,2,3")
    add_prompt_options(p, src)
    p.add_argument("--chat", "-cnv", "--conversation", action="store_true",
                   help="apply the export's chat template to --prompt as one user turn (needs jinja2)")
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help="a system message for --chat")
    p.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=32)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating after the end-of-sequence token")
    p.add_argument("--json", action="store_true", help="print token ids and timings as JSON at the end")
    add_run_options(p, "longest sequence served")
    from mla_export.cli.hints import add_foreign_flags

    # llama.cpp flags that argparse would read as -n/-s/-t with a value attached, or as an
    # abbreviation of -cnv (-c).
    add_foreign_flags(p, "generate", ("-ngl", "-fa", "-sm", "-ts", "-c"))
    return p


def add_prompt_options(p: argparse.ArgumentParser, src) -> None:
    """Options `generate` shares with `chat` (cli/commands/chat.py): the prompt from a file, stop
    strings, the chat template, llama-cli's single turn. Defined as options (not left to
    cli_hints) also so that argparse never reads -st as -s with the value "t"."""
    src.add_argument("-f", "--file", metavar="FILE",
                     help="read the prompt from FILE (llama-cli's -f; one trailing newline dropped as it does)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop when the output contains TEXT (not printed); repeat for several (needs a tokenizer)")
    p.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="a Jinja2 chat template, as a file or the template text, instead of the export's")
    p.add_argument("-st", "--single-turn", action="store_true",
                   help="llama-cli's single-turn conversation: one chat turn, then exit (here: the same as --chat)")


def read_prompt_file(args) -> None:
    """`-f FILE` into args.prompt (as llama-cli reads it: the file's text less one trailing newline)."""
    if getattr(args, "file", None) is None:
        return
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"-f {args.file}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"-f {args.file}: a directory, not a prompt file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"-f {args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"-f {args.file}: {e.strerror or e}") from None
    args.prompt = text[:-1] if text.endswith("\n") else text
    if not args.prompt:
        raise ValueError(f"-f {args.file}: the file is empty")


def _prompt(args, engine):
    if args.chat or args.single_turn:
        if args.prompt is None:
            raise ValueError("--chat takes the user message as --prompt text (or -f FILE)")
        from mla_export.runtime.chat_prompt import ChatPrompter

        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}]
        return ChatPrompter(engine, args.chat_template).prompt_ids(messages)
    if args.system is not None:
        raise ValueError("--system is used only with --chat")
    if args.chat_template is not None:
        raise ValueError("--chat-template is used only with --chat (or -st)")
    if args.prompt is not None:
        return args.prompt
    try:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    return ids


def _out_dir(args) -> str:
    if args.model_opt is not None and args.out_dir is not None and args.model_opt != args.out_dir:
        raise ValueError("give the export directory once (OUT_DIR or --model)")
    out_dir = args.model_opt or args.out_dir
    if out_dir is None:
        raise ValueError("give the export directory: mla-export generate OUT_DIR --prompt TEXT")
    from mla_export.cli.hints import hub_id_message, looks_like_hub_id

    if looks_like_hub_id(out_dir):
        raise ValueError(hub_id_message(out_dir, "generate"))
    return out_dir


def run(args, stdout=None) -> int:
    from mla_export.checkpoint.writer import RANDOM_WEIGHTS_NOTE
    from mla_export.cli.text import terminal_safe
    from mla_export.runtime import LLMEngine, SamplingParams

    out = stdout or sys.stdout
    try:
        out_dir = _out_dir(args)
        read_prompt_file(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos, output_kind="delta",
                                stop=tuple(args.stop or ()))
        engine = LLMEngine(out_dir, runtime=args.runtime, precision=args.precision, num_threads=args.threads,
                           max_num_seqs=1, max_model_len=args.max_model_len, verify=args.verify,
                           speculative_config=args.speculative_config, **decode_graph_kwargs(args))
        if engine.max_model_len < engine.facts.max_model_len:
            print(f"mla-export generate: max_model_len {engine.max_model_len} tokens (the model has "
                  f"{engine.facts.max_model_len})", file=sys.stderr)
        if engine.facts.random_weights:
            print(f"mla-export generate: note: {RANDOM_WEIGHTS_NOTE}", file=sys.stderr)
        prompt = _prompt(args, engine)
        start = time.perf_counter()
        engine.add_request("cli", prompt, params)
    except (ValueError, FileNotFoundError) as e:
        print(f"mla-export generate: {e}", file=sys.stderr)
        return 2

    first_token_at = None
    prompt_ids, token_ids, text, finish_reason = None, [], [], None
    stream = not args.json
    while engine.has_unfinished_requests():
        for o in engine.step():  # delta outputs: this step's tokens and text only
            if first_token_at is None:
                first_token_at = time.perf_counter()
            prompt_ids = o.prompt_token_ids
            token_ids += o.token_ids
            if o.new_text is not None:
                text.append(o.new_text)
            finish_reason = o.finish_reason
            if stream:  # as it comes: text, or the ids when the model has no tokenizer
                piece = o.new_text if engine.tokenizer is not None else "".join(f"{t} " for t in o.new_token_ids)
                if piece:  # control characters escaped: never raw bytes to the terminal
                    out.write(terminal_safe(piece))
                    out.flush()
    end = time.perf_counter()

    if args.json:
        decode_tokens = len(token_ids) - 1  # tokens after the first one
        decode_time = end - first_token_at
        print(json.dumps({
            "prompt_token_ids": list(prompt_ids),
            "token_ids": token_ids,
            "text": "".join(text) if engine.tokenizer is not None else None,
            "finish_reason": finish_reason,
            "time_to_first_token_s": first_token_at - start,
            "decode_tokens_per_s": decode_tokens / decode_time if decode_tokens and decode_time > 0 else None,
            "total_time_s": end - start,
            "runtime": engine.executor.describe(),
            **({} if engine.speculative_config is None else {  # drafts verified and accepted
                k: engine.stats()[k] for k in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")}),
        }, indent=2), file=out)
    else:
        out.write("\n")
        out.flush()
    return 0
