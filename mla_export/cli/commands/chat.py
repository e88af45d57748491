"""`mla-export chat OUT_DIR`: a conversation with an exported model in the terminal (llama-cli's
-cnv habit): each line you type is a user turn, the reply streams as it is generated, and the
whole conversation so far is the next turn's prompt (rendered with the export's chat template,
or --chat-template). /exit or end of input (Ctrl-D) leaves, /clear starts a new conversation
(the system message stays), Ctrl-C stops a reply (at the prompt: leaves).

Reads lines from standard input, so a pipe works too (`printf 'hi\\n' | mla-export chat OUT`):
the "> " prompt is shown only when the input is a terminal."""

from __future__ import annotations

import argparse
import sys

from mla_export.cli.engine_flags import decode_graph_kwargs

COMMANDS_HELP = "/exit (or Ctrl-D) leaves, /clear starts a new conversation, /help shows this"


def add_parser(subparsers) -> argparse.ArgumentParser:
    from mla_export.cli.commands.generate import add_prompt_options, add_run_options

    p = subparsers.add_parser("chat", help="chat with an exported model in the terminal (multi-turn, streaming)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="a directory written by `mla-export export`")
    p.add_argument("-m", "--model", dest="model_opt", metavar="OUT_DIR", help="same as OUT_DIR (llama.cpp's spelling)")
    first = p.add_mutually_exclusive_group()
    first.add_argument("-p", "--prompt", help="the first user message (then the conversation goes on from the input)")
    add_prompt_options(p, first)  # -f/--file (the first message), --stop, --chat-template, -st/--single-turn
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help="a system message for the conversation")
    p.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=512,
                   help="most tokens per reply (default 512; a reply also ends at the end-of-sequence token)")
    add_run_options(p, "longest conversation")  # sampling and engine options, as generate's
    # accepted for llama-cli habits: a conversation is what this command is
    p.add_argument("-cnv", "--conversation", "-i", "--interactive", action="store_true", help=argparse.SUPPRESS)
    from mla_export.cli.hints import add_foreign_flags

    add_foreign_flags(p, "generate", ("-ngl", "-fa", "-sm", "-ts", "-c"))
    return p


def run(args, stdin=None, stdout=None) -> int:
    from mla_export.cli.commands.generate import _out_dir, read_prompt_file
    from mla_export.runtime import LLMEngine, SamplingParams

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        out_dir = _out_dir(args)
        read_prompt_file(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, output_kind="delta", stop=tuple(args.stop or ()))
        engine = LLMEngine(out_dir, runtime=args.runtime, precision=args.precision, num_threads=args.threads,
                           max_num_seqs=1, max_model_len=args.max_model_len, verify=args.verify,
                           speculative_config=args.speculative_config, **decode_graph_kwargs(args))
        from mla_export.runtime.chat_prompt import ChatPrompter

        prompter = ChatPrompter(engine, args.chat_template)
    except (ValueError, FileNotFoundError) as e:
        print(f"mla-export chat: {e}", file=sys.stderr)
        return 2
    chat = Conversation(engine, prompter, params, args.system, stdout)
    if engine.facts.random_weights:  # the tiny preset: its replies are noise, and it says so first
        from mla_export.checkpoint.writer import RANDOM_WEIGHTS_NOTE

        print(f"mla-export chat: note: {RANDOM_WEIGHTS_NOTE}", file=sys.stderr)
    interactive = stdin.isatty()
    if interactive:
        _line_editing()
        print(f"mla-export chat: {out_dir} ({engine.max_model_len} tokens of context); {COMMANDS_HELP}",
              file=sys.stderr)
    pending = [args.prompt] if args.prompt is not None else []
    while True:
        if pending:
            line = pending.pop()
            if interactive:
                stdout.write(f"> {line}\n")
        else:
            line = _read_line(stdin, interactive, stdout)
            if line is None:  # end of input, or Ctrl-C at the prompt
                break
        text = line.strip()
        if text in ("/exit", "/quit", "/bye"):
            break
        if text == "/clear":
            chat.clear()
            print("(a new conversation)", file=sys.stderr)
            continue
        if text in ("/help", "/?") or (text.startswith("/") and " " not in text and len(text) > 1):
            print(COMMANDS_HELP if text in ("/help", "/?") else f"{text}: not a command; {COMMANDS_HELP}",
                  file=sys.stderr)
            continue
        if not text:
            continue
        chat.turn(line.rstrip("\n"))
        if args.single_turn:
            break
    return 0


def _line_editing() -> None:
    try:  # arrow keys and history for input() at a terminal, where the platform has it
        import readline  # noqa: F401
    except ImportError:
        pass


def _read_line(stdin, interactive: bool, stdout) -> str | None:
    try:
        if interactive and stdin is sys.stdin:
            return input("> ")
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        return line if line else None
    except EOFError:
        return None
    except KeyboardInterrupt:
        stdout.write("\n")
        return None


class Conversation:
    """The messages so far and one engine: each turn renders them all with the chat template and
    streams the reply, which joins the history."""

    def __init__(self, engine, prompter, params, system: str | None, out):
        self.engine, self.prompter, self.params, self.out = engine, prompter, params, out
        self.system = [{"role": "system", "content": system}] if system else []
        self.messages = list(self.system)
        self.turns = 0

    def clear(self) -> None:
        self.messages = list(self.system)

    def turn(self, text: str) -> None:
        from mla_export.cli.text import terminal_safe

        self.messages.append({"role": "user", "content": text})
        request_id = f"turn-{self.turns}"
        self.turns += 1
        try:
            self.engine.add_request(request_id, self.prompter.prompt_ids(self.messages), self.params)
        except ValueError as e:  # e.g. the conversation no longer fits the context
            self.messages.pop()
            print(f"mla-export chat: {e}; /clear starts a new conversation", file=sys.stderr)
            return
        reply, error = [], None
        try:
            while self.engine.has_unfinished_requests():
                for o in self.engine.step():
                    if o.new_text:
                        reply.append(o.new_text)
                        self.out.write(terminal_safe(o.new_text))  # never raw control bytes to the terminal
                        self.out.flush()
                    if o.finish_reason == "error":
                        error = o.error
        except KeyboardInterrupt:  # stop this reply; what was shown stays in the conversation
            self.engine.abort_request(request_id)
        self.out.write("\n")
        self.out.flush()
        if error:
            print(f"mla-export chat: the reply failed: {error}", file=sys.stderr)
        self.messages.append({"role": "assistant", "content": "".join(reply)})
