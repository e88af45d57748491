"""`mla-export chat OUT_DIR` (issue 37: there was no interactive chat, llama-cli's -cnv habit), run
as the command on the real tiny export (`mla-export export --preset tiny -o DIR`): through a pipe
and through a pseudo-terminal. The expected replies are the engine's own greedy replies to the
same conversations (f32, one thread), so the history, /clear and /exit are checked by what the
model was given, not by what its (random-weight) text says."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from mla_export.cli.text import terminal_safe

MAX = 6
FLAGS = ["-n", str(MAX), "--precision", "f32", "-t", "1"]


def chat_cmd(export, *extra) -> list[str]:
    return [sys.executable, "-m", "mla_export.cli", "chat", str(export), *FLAGS, *extra]


def engine_replies(export, conversations: list[list[str]], system: str | None = None,
                   max_model_len: int | None = None) -> list[list[str]]:
    """Greedy replies, turn by turn, each reply joining the history (what `chat` must do)."""
    from mla_export.runtime import LLMEngine, SamplingParams
    from mla_export.runtime.chat_prompt import ChatPrompter

    engine = LLMEngine(str(export), precision="f32", num_threads=1, max_num_seqs=1, max_model_len=max_model_len)
    prompter = ChatPrompter(engine)
    params = SamplingParams(max_tokens=MAX, temperature=0.0, output_kind="final_only")
    result = []
    for n, users in enumerate(conversations):
        messages = [{"role": "system", "content": system}] if system else []
        replies = []
        for i, text in enumerate(users):
            messages.append({"role": "user", "content": text})
            engine.add_request(f"{n}-{i}", prompter.prompt_ids(messages), params)
            final = None
            while engine.has_unfinished_requests():
                for o in engine.step():
                    final = o
            replies.append(final.text)
            messages.append({"role": "assistant", "content": final.text})
        result.append(replies)
    return result


def shown(replies: list[str]) -> str:
    return "".join(terminal_safe(r) + "\n" for r in replies)


def run_piped(export, stdin: str, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(chat_cmd(export, *extra), input=stdin, capture_output=True, text=True, timeout=300)


class TestConversationThroughAPipe:
    def test_history_clear_and_exit(self, exports):
        export = exports.tiny()
        (first, again), = engine_replies(export, [["Hello", "Hello"]])
        assert first != again  # the second turn's prompt holds the first exchange: another reply
        proc = run_piped(export, "Hello\nHello\n/clear\nHello\n/exit\nnot read\n")
        assert proc.returncode == 0, proc.stderr
        # after /clear the same message gets the first reply again; after /exit nothing is read
        assert proc.stdout == shown([first, again, first])
        assert "(a new conversation)" in proc.stderr and "> " not in proc.stdout  # no prompt without a terminal

    def test_end_of_input_leaves(self, exports):
        export = exports.tiny()
        (first,), = engine_replies(export, [["Hi"]])
        proc = run_piped(export, "Hi\n")
        assert proc.returncode == 0 and proc.stdout == shown([first])

    def test_system_prompt_and_first_message_from_the_command_line(self, exports):
        export = exports.tiny()
        (a, b), = engine_replies(export, [["Hi", "more"]], system="Be brief.")
        proc = run_piped(export, "more\n", "-p", "Hi", "--system", "Be brief.")
        assert proc.returncode == 0 and proc.stdout == shown([a, b])

    def test_speculative_config(self, exports):
        """n-gram drafts change no greedy reply (f32); a method that is not built is refused by name."""
        export = exports.tiny()
        replies = engine_replies(export, [["Hello", "Hello again"]])[0]
        spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
        proc = run_piped(export, "Hello\nHello again\n", "--speculative-config", spec)
        assert proc.returncode == 0 and proc.stdout == shown(replies), proc.stderr
        proc = run_piped(export, "Hello\n", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
        assert proc.returncode == 2 and "mtp" in proc.stderr

    def test_single_turn(self, exports):
        export = exports.tiny()
        (first,), = engine_replies(export, [["Hi"]])
        assert run_piped(export, "Hi\nagain\n", "-st").stdout == shown([first])
        proc = subprocess.run(chat_cmd(export, "-p", "Hi", "-st"), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout == shown([first])

    def test_chat_template_option(self, exports, tmp_path):
        export = exports.tiny()
        # a template that shows only the last message: the reply to "Hi" after any history is the
        # reply to "Hi" alone under that template
        template = "{{ messages[-1]['content'] }} =>"
        once = run_piped(export, "Hi\n", "--chat-template", template)
        twice = run_piped(export, "Hello\nHi\n", "--chat-template", template)
        assert once.returncode == 0 and twice.returncode == 0, (once.stderr, twice.stderr)
        assert twice.stdout.endswith(once.stdout) and once.stdout != shown(engine_replies(export, [["Hi"]])[0])


class TestConversationOutgrowsTheContext:
    def test_a_message_too_long_is_refused_and_forgotten(self, exports):
        export = exports.tiny()
        (hi,), = engine_replies(export, [["Hi"]], max_model_len=64)
        proc = run_piped(export, " ".join(["word"] * 80) + "\nHi\n", "--max-model-len", "64")
        assert proc.returncode == 0
        assert "more than the model's context (64)" in proc.stderr and "/clear starts a new conversation" in proc.stderr
        assert proc.stdout == shown([hi])  # the refused message is not in the history of the next turn


class TestStreaming:
    def test_each_step_is_written_and_flushed_as_it_comes(self, exports):
        from mla_export.cli.commands.chat import Conversation
        from mla_export.runtime import LLMEngine, SamplingParams
        from mla_export.runtime.chat_prompt import ChatPrompter

        class Recorder:
            def __init__(self):
                self.events = []

            def write(self, s):
                self.events.append(("write", s))

            def flush(self):
                self.events.append(("flush", None))

        export = exports.tiny()
        engine = LLMEngine(str(export), precision="f32", num_threads=1, max_num_seqs=1)
        rec = Recorder()
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, output_kind="delta")
        Conversation(engine, ChatPrompter(engine), params, None, rec).turn("Hello")
        writes = [i for i, (kind, _) in enumerate(rec.events) if kind == "write"]
        assert len(writes) >= 4  # several pieces, not one write at the end
        assert all(rec.events[i + 1][0] == "flush" for i in writes)


class TestConversationThroughATerminal:
    """A pseudo-terminal: the "> " prompt, a streamed reply, Ctrl-D at the prompt leaves."""

    def _read_until(self, fd, marker: bytes, buf: bytearray, timeout: float = 120.0) -> None:
        end = time.time() + timeout
        while marker not in buf:
            ready, _, _ = select.select([fd], [], [], max(end - time.time(), 0))
            if not ready:
                raise AssertionError(f"no {marker!r} within {timeout} s; got {bytes(buf)!r}")
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk

    def test_prompt_reply_and_ctrl_d(self, exports):
        export = exports.tiny()
        (first,), = engine_replies(export, [["Hello"]])
        master, slave = pty.openpty()
        proc = subprocess.Popen(chat_cmd(export), stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                                close_fds=True)
        os.close(slave)
        try:
            buf = bytearray()
            self._read_until(master, b"> ", buf)
            os.write(master, b"Hello\n")
            expected = terminal_safe(first).replace("\n", "\r\n").encode() + b"\r\n> "
            self._read_until(master, expected, buf)
            os.write(master, b"\x04")  # Ctrl-D at the prompt
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        assert b"Hello\r\n" + expected in bytes(buf)
        assert "/exit (or Ctrl-D) leaves" in proc.stderr.read().decode()


class TestErrors:
    def test_not_an_export_and_bad_template(self, exports, tmp_path):
        proc = run_piped(tmp_path, "Hi\n")
        assert proc.returncode == 2 and proc.stderr.startswith("mla-export chat: ")
        proc = run_piped(exports.tiny(), "Hi\n", "--chat-template", str(tmp_path / "missing.jinja"))
        assert proc.returncode == 2 and "chat template file not found" in proc.stderr

    @pytest.mark.parametrize("flag", ["-ngl", "--repeat-penalty"])
    def test_foreign_flags_get_hints(self, flag):
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "chat", "x", flag, "1"], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and f"{flag} is not an option of `mla-export" in proc.stderr
