#!/usr/bin/env python3
"""s04_subagent.py - a subagent with a fresh context.

    parent messages: [..., you, tool_use task(prompt), tool_result(summary), ...]
                                    |                          ^
                                    v                          |
    child messages (new, empty):  [prompt, tool_use, result, ..., final text]
                                   CHILD_TOOLS (no task), at most 30 turns,
                                   thrown away when the child is done

Key insight: context is the scarce resource. The parent hands a sub-task to
a child agent that starts from nothing, works in its own conversation with
the same tools and fences, and gives back only a short summary, so the
parent's context stays small however much the child read.
"""

import collections
import contextlib
import itertools
import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anthropic
from dotenv import load_dotenv

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000
BASH_TIMEOUT = 120  # seconds
SUBAGENT_MAX_TURNS = 30  # model calls a child may make before it is stopped
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
API_TIMEOUT = 60  # seconds the server may stay silent (while streaming: between two events) before a call is given up
API_RETRIES = 2  # the SDK tries a failed call this many more times: timeouts, lost connections, 429, 529 and 5xx
WORKDIR = Path.cwd()
STAGE = "s04"
PROMPT = f"{STAGE} >> "

# Built by main(), never at import, so that importing a stage has no side
# effects. Tests put a scripted model here.
client = None

CHILD_TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command in the workspace and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a UTF-8 text file. `limit` keeps only the first N lines.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with `content`, creating missing folders.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit_file",
        "description": "Replace `old_text`, which must occur exactly once in the file, with `new_text`.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_text": {"type": "string"},
                "new_text": {"type": "string"},
            },
            "required": ["path", "old_text", "new_text"],
        },
    },
    {
        "name": "list_dir",
        "description": "List a folder (default: the workspace); folders end with '/'.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": [],
        },
    },
]
TASK_TOOL = {
    "name": "task",
    "description": (
        "Hand a self-contained sub-task (exploring code, a focused change) to a subagent. It starts "
        "with an empty context, has your tools except task, and returns only a summary of its work."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "everything the subagent needs to know: it sees nothing else"},
            "description": {"type": "string", "description": "a short label to show the user"},
        },
        "required": ["prompt"],
    },
}
PARENT_TOOLS = CHILD_TOOLS + [TASK_TOOL]  # the child never gets task: no recursion, by construction


def valid_utf8(text: str) -> str:
    """Text the API can take. Python stands in for bytes that are not UTF-8 (in a file name, say)
    with lone surrogates, which cannot be sent; each becomes the replacement character."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def system_prompt() -> str:
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly. Hand large explorations to the "
        "task tool, so that only their summary enters this conversation."
    )


def child_system_prompt() -> str:
    return valid_utf8(
        f"You are a subagent working in {WORKDIR} on one task given by another agent. "
        "Do only that task. You cannot ask questions and cannot delegate. End with a "
        "concise summary of what you found or changed: it is all the other agent will see."
    )


# -- fence 1: every file path stays inside the workspace --------------------------


def safe_path(path: str) -> Path:
    """Resolve a model-supplied path inside WORKDIR, or raise ValueError.

    resolve() follows every symlink and `..`, so what is checked is where the
    path really leads, not how it is spelled.
    """
    if "\0" in path:
        raise ValueError("the path contains a NUL byte")
    workspace = WORKDIR.resolve()
    try:
        target = (workspace / path).resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop, for one
        raise ValueError(f"cannot resolve {path!r}: {error}") from None
    if not target.is_relative_to(workspace):  # compares whole parts: /work/app2 is not in /work/app
        raise ValueError(f"{path!r} is outside the workspace {workspace}")
    return target


# -- fence 2: dangerous commands are refused ---------------------------------------
# A shell command line is a small program. To judge it, split it the way the shell
# does into the simple commands it runs (through ; && || | & newlines, $(...),
# backticks, bash -c, eval, xargs, env and other wrappers), then judge each by its
# program and arguments. Words are judged, never substrings: `grep -rn sudo .` and
# `echo "rm -rf /"` are fine.

REFUSED_PROGRAMS = {
    "sudo": "changes privileges", "su": "changes privileges", "doas": "changes privileges",
    "pkexec": "changes privileges",
    "shutdown": "powers off the machine", "reboot": "restarts the machine", "halt": "stops the machine",
    "poweroff": "powers off the machine",
    "wipefs": "erases disk signatures", "fdisk": "repartitions a disk", "sfdisk": "repartitions a disk",
    "cfdisk": "repartitions a disk", "parted": "repartitions a disk", "gdisk": "repartitions a disk",
    "killall5": "kills every process",
}
SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "ash"}
INTERPRETERS = {"python", "node", "perl", "ruby", "php"}  # their inline code is checked for commands in strings
DOWNLOADERS = {"curl", "wget"}
# Wrappers run the command after them: {wrapper: options that take a value}.
WRAPPERS = {
    "env": {"-u", "--unset", "-C", "--chdir", "-S"}, "nohup": set(), "time": {"-f", "-o"},
    "command": set(), "builtin": set(), "exec": {"-a"}, "nice": {"-n"}, "ionice": {"-c", "-n"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"}, "stdbuf": {"-i", "-o", "-e"},
    "xargs": {"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"}, "watch": {"-n"},
}
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}"}
SYSTEM_DIRS = [Path(p) for p in ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt",
                                 "/proc", "/root", "/sbin", "/sys", "/usr", "/var", "/Users", "/System", "/Library")]
HARMLESS_DEVICES = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/tty",
                    "/dev/stdin", "/dev/stdout", "/dev/stderr"}
START_UP_FILES = {".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile",
                  ".zshrc", ".zshenv", ".zprofile", ".zlogin"}
FORK_BOMB = re.compile(r"([^\s();|&]+)\s*\(\s*\)\s*\{([^}]*)\}")  # name() { ... name ... }
OPERATORS = ["&&", "||", "|&", ";;", "&>>", "&>", ">>", ">|", ">&", "<<<", "<<", "<&", ";", "&", "|", "(", ")", "<", ">"]
WRITES = {">", ">>", ">|", "&>", "&>>", ">&"}


def find_or_end(text: str, sub: str, start: int) -> int:
    index = text.find(sub, start)
    return len(text) if index < 0 else index


def closing(script: str, start: int) -> int:
    """Index of the bracket or backtick closing the one at `start`, skipping quoted text."""
    opener = script[start]
    closer, depth, i = {"(": ")", "`": "`"}[opener], 0, start
    while i < len(script):
        char = script[i]
        if char == "\\":
            i += 1
        elif char == "'" and opener != "`":
            i = find_or_end(script, "'", i + 1)
        elif char == closer and (depth == 1 or opener == "`") and i > start:
            return i
        elif char == opener:
            depth += 1
        elif char == closer:
            depth -= 1
        i += 1
    return len(script)


def substitution(script: str, opener: int) -> tuple:
    """The script inside the ( or ` at `opener` (of $(...), <(...), `...`), and the index after its end."""
    end = closing(script, opener)
    return script[opener + 1:end], end + 1


def take_heredoc(script: str, i: int) -> tuple:
    """For the heredoc whose << ends at i: its body, the script without the body, the index after its delimiter."""
    match = re.compile(r"-?\s*(['\"]?)([^\s'\"<>|&;()]+)\1").match(script, i)
    if not match:
        return "", script, i
    line_end = find_or_end(script, "\n", i)
    body_end = re.compile(rf"^\t*{re.escape(match.group(2))}$", re.MULTILINE).search(script, line_end + 1)
    if body_end is None:
        return script[line_end + 1:], script[:line_end + 1], match.end()
    return script[line_end + 1:body_end.start()], script[:line_end + 1] + script[body_end.end() + 1:], match.end()


def tokenize(script: str) -> list:
    """Split shell text into ("word", text, inner scripts) and ("op", text, []) tokens.

    Quotes and backslashes are removed from words as the shell removes them.
    $(...), `...` and <(...) become inner scripts (they run too). A heredoc
    becomes a here-string: the operator <<< followed by its body as a word.
    """
    tokens, word, inner, in_word, i = [], "", [], False, 0

    def end_word():
        nonlocal word, inner, in_word
        if in_word:
            tokens.append(("word", word, inner))
        word, inner, in_word = "", [], False

    while i < len(script):
        char, pair = script[i], script[i:i + 2]
        if char == "\\":
            word, in_word, i = word + script[i + 1:i + 2].strip("\n"), True, i + 2
        elif char == "'":
            end = find_or_end(script, "'", i + 1)
            word, in_word, i = word + script[i + 1:end], True, end + 1
        elif pair == "$'":  # ANSI-C quoting: $'\x72m' is rm
            end = i + 2
            while end < len(script) and script[end] != "'":
                end += 2 if script[end] == "\\" else 1
            text = script[i + 2:end].encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")
            word, in_word, i = word + text, True, end + 1
        elif char == '"':  # inside double quotes, $(...) and `...` still run
            i += 1
            while i < len(script) and script[i] != '"':
                if script[i] == "\\" and script[i + 1:i + 2] in ('"', "\\", "$", "`", "\n"):
                    word, i = word + script[i + 1].strip("\n"), i + 2
                elif script[i:i + 2] == "$(" or script[i] == "`":
                    body, i = substitution(script, i + (script[i] != "`"))
                    inner.append(body)
                    word += "$(...)"
                else:
                    word, i = word + script[i], i + 1
            in_word, i = True, i + 1
        elif pair in ("$(", "<(", ">(") or char == "`":
            body, i = substitution(script, i + (char != "`"))
            inner.append(body)
            word, in_word = word + "$(...)", True
        elif char == "#" and not in_word:  # a comment, to the end of the line
            i = find_or_end(script, "\n", i)
        elif char in " \t":
            end_word()
            i += 1
        elif char == "\n":
            end_word()
            tokens.append(("op", "\n", []))
            i += 1
        elif op := next((op for op in OPERATORS if script.startswith(op, i)), None):
            if char in "<>" and word.isdigit():  # in 2>&1 the 2 is a file descriptor, not a word
                word, in_word = "", False
            end_word()
            i += len(op)
            if op == "<<":
                body, script, i = take_heredoc(script, i)
                tokens += [("op", "<<<", []), ("word", body, [])]
            else:
                tokens.append(("op", op, []))
        else:
            word, in_word, i = word + char, True, i + 1
    end_word()
    return tokens


def parse(script: str) -> list:
    """The pipelines a script runs; each is a list of simple commands:
    {"words": [...], "redirects": [(operator, target)], "stdin": text or None, "inner": [scripts]}."""
    def new():
        return {"words": [], "redirects": [], "stdin": None, "inner": []}
    pipelines, pipeline, command, redirect = [], [], new(), None
    for kind, text, inner in tokenize(script) + [("op", ";", [])]:
        if kind == "word":
            command["inner"] += inner
            if redirect == "<<<":
                command["stdin"] = text
            elif redirect:
                command["redirects"].append((redirect, text))
            else:
                command["words"].append(text)
            redirect = None
        elif text in ("|", "|&"):
            pipeline.append(command)
            command = new()
        elif text in (";", ";;", "&", "&&", "||", "\n", "(", ")"):
            pipeline.append(command)
            pipelines.append([c for c in pipeline if c["words"] or c["redirects"] or c["inner"]])
            pipeline, command = [], new()
        else:
            redirect = text
    return [p for p in pipelines if p]


def program_name(word: str) -> str:
    """`/usr/bin/../bin/rm` is rm, `python3.12` is python."""
    name = word.rsplit("/", 1)[-1]
    return re.sub(r"^(python|pypy)[0-9.]*$", "python", name)


def unwrap(words: list) -> list:
    """Strip what runs the real command: VAR=value, keywords and wrappers (env, nohup, xargs ...)."""
    while words:
        first = words[0].lstrip("{(")
        name = program_name(first)
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", first) or first in KEYWORDS or not first:
            words = words[1:]  # env's own VAR=value words go this way too
            continue
        if name == "command" and words[1:2] in (["-v"], ["-V"]):
            return []  # `command -v rm` only asks where rm is
        if name not in WRAPPERS:
            return [first, *words[1:]]
        rest = words[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in WRAPPERS[name] else rest[1:]
        if name == "timeout" and rest:
            rest = rest[1:]  # the duration
        if name == "xargs" and rest:
            rest = [*rest, "$XARGS_INPUT"]  # arguments arrive on stdin: the filter cannot see them
        words = rest
    return words


def where(word: str) -> Path | None:
    """The absolute path a command argument names, or None when the filter cannot tell ($VAR, ~user)."""
    if "\0" in word:
        return None
    text = os.path.expanduser(os.path.expandvars(word))
    if text.startswith("~") or "$" in text:
        return None
    text = re.split(r"[*?[]", text)[0] or "."  # `build/*` deletes inside build/, `/*` inside /
    return (WORKDIR.resolve() / text).resolve()


def inside_workspace(path: Path) -> bool:
    return path.is_relative_to(WORKDIR.resolve())


def system_path(path: Path | None) -> bool:
    return path is not None and not inside_workspace(path) and (
        path == Path("/") or any(path.is_relative_to(folder) for folder in SYSTEM_DIRS))


def write_refusal(target: str) -> str | None:
    """Why writing to `target` must not happen: a device, kernel settings, system or start-up files."""
    path = where(target)
    if path is None or inside_workspace(path):
        return None
    if str(path) in HARMLESS_DEVICES or path.is_relative_to("/dev/fd"):
        return None
    if path.is_relative_to("/dev"):
        return f"writes to the device {target}"
    if path.is_relative_to("/proc") or path.is_relative_to("/sys"):
        return f"writes kernel settings ({target})"
    if path.name in START_UP_FILES:
        return f"writes the shell start-up file {target}"
    if system_path(path):
        return f"writes the system file {target}"
    return None


def options_and_operands(args: list) -> tuple:
    """Split arguments into options (-rf, --force) and operands; `--` ends the options."""
    if "--" in args:
        cut = args.index("--")
        return [a for a in args[:cut] if a.startswith("-")], [a for a in args[:cut] if not a.startswith("-")] + args[cut + 1:]
    return [a for a in args if a.startswith("-") and a != "-"], [a for a in args if not a.startswith("-") or a == "-"]


def has_flag(options: list, letters: str, long: str) -> bool:
    return any(o == long or (not o.startswith("--") and any(c in o[1:] for c in letters)) for o in options)


def check_rm(args: list) -> str | None:
    options, targets = options_and_operands(args)
    recursive = has_flag(options, "rR", "--recursive")
    if "--no-preserve-root" in options:
        return "rm --no-preserve-root deletes the whole machine"
    for target in targets:
        path = where(target)
        if recursive and path is None:
            return f"rm -r {target}: the filter cannot tell where that points"
        if recursive and path == WORKDIR.resolve():
            return f"rm -r {target} deletes the whole workspace"
        if recursive and not inside_workspace(path):
            return f"rm -r {target} deletes outside the workspace"
        if system_path(path):
            return f"rm {target} deletes a system file"
    return None


def check_recursive_mode_change(args: list) -> str | None:
    options, targets = options_and_operands(args)
    if has_flag(options, "R", "--recursive") and any(where(t) is None or system_path(where(t)) for t in targets):
        return "changes owners or permissions recursively in a system folder"
    return None


def check_find(args: list) -> str | None:
    starts = list(itertools.takewhile(lambda a: not a.startswith(("-", "(", "!")), args)) or ["."]
    acts = {"-delete", "-exec", "-execdir", "-ok", "-okdir"} & set(args)
    if acts and any(where(s) is None or not inside_workspace(where(s)) for s in starts):
        return f"find {' '.join(starts)} {min(acts)} acts on files outside the workspace"
    for action in ("-exec", "-execdir", "-ok", "-okdir"):
        if action in args:
            rest = args[args.index(action) + 1:]
            reason = check_words(list(itertools.takewhile(lambda a: a not in (";", "+"), rest)))
            if reason:
                return reason
    return None


def check_kill(args: list) -> str | None:
    return "kills every process (-1 means all of them)" if "-1" in args[1:] else None


def check_pkill(args: list) -> str | None:
    _, operands = options_and_operands(args)
    return "kills every process (the pattern matches anything)" if {".", ".*", "^"} & set(operands) else None


def check_runlevel(args: list) -> str | None:  # init, telinit
    return "shuts down or restarts the machine" if args[:1] in (["0"], ["6"]) else None


def check_systemctl(args: list) -> str | None:
    return "powers off or restarts the machine" if {"poweroff", "reboot", "halt", "kexec"} & set(args) else None


def check_dd(args: list) -> str | None:
    targets = [a.removeprefix("of=") for a in args if a.startswith("of=")]
    return next(filter(None, map(write_refusal, targets)), None)


def check_writes_every_operand(args: list) -> str | None:  # tee, shred, truncate, mv (its source is gone too)
    return next(filter(None, map(write_refusal, options_and_operands(args)[1])), None)


def check_writes_last_operand(args: list) -> str | None:  # cp, ln, install: only the destination is written
    operands = options_and_operands(args)[1]
    return write_refusal(operands[-1]) if operands else None


RULES = {  # program -> a function of its arguments that says why not, or None
    "rm": check_rm, "find": check_find, "dd": check_dd,
    "chmod": check_recursive_mode_change, "chown": check_recursive_mode_change, "chgrp": check_recursive_mode_change,
    "kill": check_kill, "pkill": check_pkill, "killall": check_pkill,
    "init": check_runlevel, "telinit": check_runlevel, "systemctl": check_systemctl,
    "tee": check_writes_every_operand, "shred": check_writes_every_operand, "truncate": check_writes_every_operand,
    "mv": check_writes_every_operand, "cp": check_writes_last_operand, "ln": check_writes_last_operand,
    "install": check_writes_last_operand,
}


def is_download(simple: dict) -> bool:
    words = unwrap(simple["words"])
    return bool(words) and program_name(words[0]) in DOWNLOADERS


def downloads(script: str) -> bool:
    return any(is_download(simple) for pipeline in parse(script) for simple in pipeline)


def check_words(words: list, stdin: str | None = None, fed_by_download: bool = False) -> str | None:
    """Judge one simple command by its program and arguments."""
    words = unwrap(words)
    if not words:
        return None
    program, args = program_name(words[0]), words[1:]
    if program in REFUSED_PROGRAMS:
        return f"{program} {REFUSED_PROGRAMS[program]}"
    if program.startswith("mkfs") or (program == "mkswap" and args):
        return f"{program} formats a disk"
    runs_code = program in SHELLS | INTERPRETERS | {"eval", "source", "."}
    if runs_code and fed_by_download:
        return f"runs code downloaded from the network with {program}"
    if program in SHELLS:
        script = next((args[i + 1] for i, a in enumerate(args[:-1]) if re.match(r"^-[a-z]*c[a-z]*$", a)), stdin)
        return check_command(script) if script else None
    if program == "eval":
        return check_command(" ".join(args))
    if program in INTERPRETERS:
        code = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "-e", "-E", "-r")), stdin) or ""
        strings = re.findall(r"'([^']*)'|\"([^\"]*)\"|`([^`]*)`", code)
        return next(filter(None, (check_command("".join(s)) for s in strings)), None)
    rule = RULES.get(program)
    return rule(args) if rule else None


def check_command(command: str) -> str | None:
    """Why this command line must not run, or None. A pure function: it never runs anything."""
    for name, body in FORK_BOMB.findall(command):
        if name in re.split(r"[\s|&;]+", body):
            return f"the function {name} starts copies of itself (a fork bomb)"
    for pipeline in parse(command):
        for position, simple in enumerate(pipeline):
            for script in simple["inner"]:  # $(...) and <(...) run before the command itself
                reason = check_command(script)
                if reason:
                    return reason
            for operator, target in simple["redirects"]:
                reason = write_refusal(target) if operator in WRITES else None
                if reason:
                    return reason
            fed_by_download = (any(downloads(script) for script in simple["inner"])
                               or any(is_download(earlier) for earlier in pipeline[:position]))
            reason = check_words(simple["words"], simple["stdin"], fed_by_download)
            if reason:
                return reason
    return None


# -- fence 3: a bash tool that cannot be wedged -------------------------------------

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def command_env() -> dict:
    """The agent's environment without its secrets: the command needs none of them."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("ANTHROPIC_") and not any(word in name.upper() for word in SECRET_WORDS)}


def read_output(process) -> tuple:
    """Read the command's output until it ends, passes MAX_OUTPUT, or time runs out.

    Returns (bytes, why it was stopped, or None). The shell's exit ends the
    read even if a background child still holds the pipe open.
    """
    deadline = time.monotonic() + BASH_TIMEOUT
    chunks, size = [], 0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.05)
        chunk = os.read(process.stdout.fileno(), 65536) if ready else b""
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_OUTPUT:  # never hold much more than the model will see
            return b"".join(chunks), f"output passed {MAX_OUTPUT:,} characters"
        if ready and not chunk:  # end of output: now wait for the shell itself
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                break
            return b"".join(chunks), None
        if not ready and process.poll() is not None:
            return b"".join(chunks), None
    return b"".join(chunks), f"timed out after {BASH_TIMEOUT}s"


# -- the tools ---------------------------------------------------------------


def cap(text: str) -> str:
    """Cut text to MAX_OUTPUT characters, saying how much was cut."""
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"


def run_bash(command: str) -> str:
    """Run a checked shell command in WORKDIR; return its output and any failure."""
    reason = check_command(command)
    if reason:
        raise PermissionError(f"refused, not run: {reason}. Find a safer way, or ask the user to run it")
    process = subprocess.Popen(
        command, shell=True, cwd=WORKDIR, env=command_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        data, stopped = read_output(process)
        exit_code = process.poll()
    finally:  # kill the whole process group: nothing the command started outlives the call
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
    output = cap(data.decode(errors="replace"))
    if stopped:
        output += f"\n(stopped: {stopped}; the command and everything it started were killed)"
    elif exit_code:
        output += f"\n(exit code {exit_code})"
    return output or "(no output)"


FILE_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
              (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]


def check_kind(file: Path, path: str, wanted: str = "a regular file") -> None:
    """Refuse anything but a regular file (or a folder, for list_dir), before it is opened:
    opening a FIFO waits for a writer forever, and a device such as /dev/zero never ends."""
    mode = file.stat().st_mode
    kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
    if kind != wanted:
        raise ValueError(f"{path} is {kind}, not {wanted}")


def read_start(opened, limit: int | None) -> str:
    """The first `limit` lines (all if None) of an open file, but never more than MAX_OUTPUT
    characters: only what can be shown is read, however big the file is."""
    lines, size = [], 0
    while (limit is None or len(lines) < limit) and size < MAX_OUTPUT:
        line = opened.readline(MAX_OUTPUT - size)  # a size, so that one endless line is cut too
        if not line:
            break
        lines.append(line)
        size += len(line)
    return "".join(lines)


def read_file(path: str, limit: int | None = None) -> str:
    file = safe_path(path)
    check_kind(file, path)
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    try:
        # Text mode decodes as it reads: a character split by a read boundary is completed by the next read.
        with open(file, encoding="utf-8", newline="") as opened:  # newline="": \r\n is shown as it is
            text = read_start(opened, limit)
            more = opened.read(1) != ""
            size = os.fstat(opened.fileno()).st_size
        if "\0" in text:
            raise UnicodeError
    except UnicodeError:
        raise ValueError(f"{path} is a binary or non-UTF-8 file ({file.stat().st_size:,} bytes); not shown") from None
    if not more:
        return text
    left = size - len(text.encode())  # the rest was never read: the file's size says how big it is
    return text + ("" if text.endswith("\n") else "\n") + f"... [{left} more bytes not shown]"


def write_atomically(file: Path, text: str) -> None:
    """Write `text` to a new file beside `file`, then rename it over `file` in one step.

    Until the rename the old file is untouched, so a failed write leaves it as it was. And
    the name gets a new file of its own: a hard link's other name keeps the old content.
    """
    target = file.resolve()  # through a symlink, as open() would go: the file it points to is replaced
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(f"{file} is read-only")
    temp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        with open(temp, "x", encoding="utf-8", newline="") as out:  # "x": a new file, with the usual permissions
            if target.exists():  # keep its permission bits: a script stays executable
                os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
            out.write(text)  # newline="": write exactly what was given
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename, so a crash cannot leave an empty file
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_file(path: str, content: str) -> str:
    file = safe_path(path)
    if file.exists():
        check_kind(file, path)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(file, content)
    return f"wrote {len(content):,} characters to {path}"


def edit_file(path: str, old_text: str, new_text: str) -> str:
    file = safe_path(path)
    check_kind(file, path)
    text = file.read_bytes().decode("utf-8")  # bytes, so that \r\n line ends survive the edit
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    found = text.count(old_text)
    if found == 0:
        raise ValueError(f"old_text not found in {path}; read the file and copy the text exactly")
    if found > 1:
        raise ValueError(f"old_text occurs {found} times in {path}; add surrounding lines so it matches once")
    write_atomically(file, text.replace(old_text, new_text))
    return f"edited {path}"


def list_dir(path: str = ".") -> str:
    folder = safe_path(path)
    check_kind(folder, path, "a folder")
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return cap("\n".join(entries)) or "(empty folder)"


TOOL_HANDLERS = {
    "bash": run_bash,
    "read_file": read_file,
    "write_file": write_file,
    "edit_file": edit_file,
    "list_dir": list_dir,
}
JSON_TYPES = {"string": str, "integer": int}


def check_args(schema: dict, args: dict) -> str | None:
    """Say what is wrong with the model's arguments for a tool, or None if they fit its schema."""
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        spec = schema["properties"].get(name)
        if spec is None:
            return f"unexpected argument {name!r}; this tool takes {', '.join(schema['properties'])}"
        if not isinstance(value, JSON_TYPES[spec["type"]]) or isinstance(value, bool):
            return f"argument {name!r} must be of type {spec['type']}, not {type(value).__name__}"
    return None


def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text), "is_error": is_error}


def dispatch(block, tools: list) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    schemas = {tool["name"]: tool["input_schema"] for tool in tools}
    if block.name not in schemas:
        return tool_result(block, f"error: unknown tool {block.name!r}; the tools are {', '.join(schemas)}", True)
    if not isinstance(block.input, dict):
        return tool_result(block, f"error: a tool's input must be an object of arguments, not {type(block.input).__name__}", True)
    args = {name: value for name, value in block.input.items() if value is not None}  # null means "not given"
    problem = check_args(schemas[block.name], args)
    if problem:
        return tool_result(block, f"error: {block.name}: {problem}", True)
    try:
        return tool_result(block, TOOL_HANDLERS[block.name](**args))
    except Exception as error:  # noqa: BLE001 - a failing tool is news for the model, not a crash
        return tool_result(block, f"error: {type(error).__name__}: {error}", True)


# -- the loop ----------------------------------------------------------------


class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""


def dim(text: str) -> str:
    """Grey on a terminal; plain in a pipe or a file, or when NO_COLOR is set."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[2m{text}\033[0m"
    return text


def show_tool_call(block, indent: str = "") -> None:
    arguments = block.input if isinstance(block.input, dict) else {"input": block.input}  # shown before it is checked
    args = " ".join(str(value) for value in arguments.values()).replace("\n", " ")
    label = str(arguments.get("description") or "")  # any type may come: the arguments are not checked yet
    print(dim(f"{indent}> {block.name}: {(label or args)[:120]}"))


def show_tool_result(result: dict, indent: str = "") -> None:
    lines = result["content"].splitlines() or [""]
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    print(dim(f"{indent}  {lines[0][:120]}{more}"))


def run_tool(block, tools: list, indent: str = "") -> dict:
    """Run one tool call, showing the call and the first line of its result."""
    show_tool_call(block, indent)
    result = dispatch(block, tools)
    show_tool_result(result, indent)
    return result


def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what was read from or written to the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def show_usage(usage) -> None:
    """One line per model call: how big the context is, and how much came from the cache."""
    print(dim(f"[context {context_tokens(usage):,} tokens, {usage.cache_read_input_tokens or 0:,} read from cache; "
              f"output {usage.output_tokens:,}]"))


def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")


def save_transcript(agent: str, request: dict, response) -> None:
    """With TRANSCRIPT=file.jsonl set, append one JSON line per model call: the arguments sent and
    the reply (null if the call failed). The key is not among them: the client sends it as a header."""
    path = os.environ.get("TRANSCRIPT")
    if path:
        line = {"agent": agent, "request": request, "response": response}
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line, default=lambda block: block.model_dump(mode="json", exclude_none=True)) + "\n")


def call_model(messages: list, tools: list, system: str, agent: str = "parent") -> anthropic.types.Message:
    """The one place the API is called. The reply streams in, and its text is printed as it arrives."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system,
        "messages": messages,
        "tools": tools,
        "tool_choice": {"type": "auto"},  # the API's default, but some compatible servers offer no tools without it
        "max_tokens": MAX_TOKENS,
        # Every call re-sends the whole conversation; caching makes the repeat cheap.
        "cache_control": {"type": "ephemeral"},
    }
    response = None
    try:
        with client.messages.stream(**request) as stream:
            for text in stream.text_stream:
                if agent == "parent":  # a child's text is shown below, indented, once its reply is complete
                    print(text, end="", flush=True)
            response = stream.get_final_message()
    finally:
        save_transcript(agent, request, response)
    if text_of(response.content) and agent == "parent":
        print()  # end the line the text streamed onto
    elif text_of(response.content) and response.stop_reason == "tool_use":  # its last answer shows as the task result
        print(textwrap.indent(text_of(response.content), "    "))
    return response


def take_reply(messages: list, response, tools: list, indent: str = "") -> str | None:
    """Add the model's reply to the history and act on why it stopped.

    Returns the final text when the turn is over, or None when the model
    should be called again (its tools have run, or it was paused).
    """
    reason = response.stop_reason
    if reason == "refusal":
        raise TurnFailed("the model declined this request (refusal); rephrase it and try again")
    if reason == "model_context_window_exceeded":
        raise TurnFailed("the conversation no longer fits the model's context window; start a new session")
    # An empty assistant message would make every later request invalid.
    content = response.content or [{"type": "text", "text": "(empty reply)"}]
    if messages[-1]["role"] == "assistant":  # the turn was paused: this reply goes on with the same message
        messages[-1]["content"] = [*messages[-1]["content"], *content]
    else:
        messages.append({"role": "assistant", "content": content})
    calls = [block for block in response.content if block.type == "tool_use"]
    if reason == "pause_turn":
        return None  # the API paused a long turn; sending it back as it is resumes it
    if reason == "max_tokens":
        print(dim("(the reply was cut off at max_tokens)"))
        if calls:  # a cut-off call may have lost arguments: answer it, never run it
            cut = "error: not run: your reply was cut off at max_tokens. Try again with a shorter call."
            messages.append({"role": "user", "content": [tool_result(block, cut, True) for block in calls]})
            return None
    if reason == "tool_use" and calls:
        messages.append({"role": "user", "content": [run_tool(block, tools, indent) for block in calls]})
        return None
    return text_of(response.content)


def agent_loop(messages: list) -> str:
    """Call the model and run its tools until it stops; return its final text."""
    while True:
        response = call_model(messages, PARENT_TOOLS, system_prompt())
        show_usage(response.usage)
        final_text = take_reply(messages, response, PARENT_TOOLS)
        if final_text is not None:
            return final_text


def describe_api_error(error: anthropic.APIError) -> str:
    if isinstance(error, anthropic.APITimeoutError):
        return (f"API error: no answer for {API_TIMEOUT}s, {API_RETRIES + 1} times; "
                "check ANTHROPIC_BASE_URL, or try again later")
    if isinstance(error, anthropic.APIConnectionError):
        return f"API error: cannot reach the API ({error}); check your network and ANTHROPIC_BASE_URL"
    if isinstance(error, anthropic.APIStatusError) and error.status_code in (400, 401, 403, 404):
        # From a proxy or a compatible provider these usually mean a wrong setting, whatever the message says.
        return (f"API error {error.status_code}: {error.message}; "
                "check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID")
    if isinstance(error, anthropic.APIStatusError):
        return f"API error {error.status_code}: {error.message}"
    return f"API error: {error}"


def run_turn(messages: list, user_text: str) -> None:
    """One turn of the conversation. On any failure, drop the turn so the history stays valid."""
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - nothing that goes wrong in a turn ends the session
        del messages[start:]
        if isinstance(error, KeyboardInterrupt):
            reason = "interrupted"
        elif isinstance(error, anthropic.APIError):
            reason = describe_api_error(error)
        elif isinstance(error, TurnFailed):
            reason = str(error)
        else:
            reason = f"{type(error).__name__}: {error}"
        print(f"\n{reason}. This turn was dropped from the conversation (files it changed stay changed).")


# -- the subagent ----------------------------------------------------------------


def run_subagent(prompt: str) -> str:
    """Run a child agent on `prompt` in a fresh conversation; block until it is done.

    Returns only the child's final text; its messages are thrown away. It has
    CHILD_TOOLS (the same fences as the parent, but no task) and at most
    SUBAGENT_MAX_TURNS model calls.
    """
    messages = [{"role": "user", "content": prompt}]
    started, tokens, tools_used = time.monotonic(), 0, collections.Counter()
    final_text, last_text, turns = None, "", 0
    try:
        while final_text is None and turns < SUBAGENT_MAX_TURNS:
            response = call_model(messages, CHILD_TOOLS, child_system_prompt(), agent="child")
            turns += 1
            tokens += context_tokens(response.usage) + response.usage.output_tokens
            tools_used.update(block.name for block in response.content if block.type == "tool_use")
            last_text = text_of(response.content) or last_text
            final_text = take_reply(messages, response, CHILD_TOOLS, indent="    ")
    except (anthropic.APIError, TurnFailed) as error:
        reason = describe_api_error(error) if isinstance(error, anthropic.APIError) else str(error)
        raise RuntimeError(f"the subagent stopped: {reason}") from None
    finally:  # for the terminal only: the parent model never sees this line
        used = ", ".join(f"{name} x{count}" for name, count in tools_used.items()) or "no tools"
        print(dim(f"    = subagent: {turns} turns, {used}, {time.monotonic() - started:.1f}s, {tokens:,} tokens"))
    if final_text is None:
        return f"(the subagent stopped after {SUBAGENT_MAX_TURNS} turns without finishing.) " + (
            f"Its last text: {last_text}" if last_text else "It left no text.")
    return final_text or "(subagent returned no text)"


def run_task(prompt: str, description: str = "") -> str:
    return run_subagent(prompt)  # the description is only a label for the user


TOOL_HANDLERS["task"] = run_task  # a handler for the parent's extra tool; the child is never offered it


# -- start-up ------------------------------------------------------------------

MISSING_KEY = """\
No API key: set ANTHROPIC_API_KEY, in the environment or in a .env file beside
this script (copy .env.example to .env and fill it in). For an
Anthropic-compatible provider also set ANTHROPIC_BASE_URL; MODEL_ID picks the
model. No key at all? `python tests/demo.py {stage}` shows this stage working
with a scripted model."""


def make_client():
    """Build the API client from the environment, or None when no key is set."""
    api_key = os.environ.get("ANTHROPIC_API_KEY")
    if not api_key:
        return None
    # An empty ANTHROPIC_BASE_URL means "not set", which the SDK would not assume.
    base_url = os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    return anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=API_TIMEOUT, max_retries=API_RETRIES)


def main() -> int:
    global client
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show is printed as "?"
    load_dotenv()
    client = make_client()
    if client is None:
        print(MISSING_KEY.format(stage=STAGE), file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # noqa: F401 - loading it gives input() line editing, and Up recalls earlier lines
    messages = []
    while True:
        try:
            user_text = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if user_text.strip().lower() in ("q", "exit"):
            return 0
        if user_text.strip():
            run_turn(messages, user_text)


if __name__ == "__main__":
    sys.exit(main())
