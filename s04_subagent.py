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

Map: settings, CHILD_TOOLS, TASK_TOOL and PARENT_TOOLS; the subagent
(run_subagent, run_task): new here; then s03's fences, s02's tools, s01's
loop (its pieces now take the tools and the agent as arguments), what you
see, the wire, and start-up.
"""

import sys

# The wall leaves the workspace writable, and Python imports from a script's own folder first:
# started in its own folder, the stage drops it, so that a module planted there (a dotenv.py,
# say) cannot run at the next start, outside the wall.
if __name__ == "__main__" and not sys.flags.safe_path:
    del sys.path[0]

import collections
import contextlib
import functools
import itertools
import json
import logging
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from dotenv import find_dotenv, load_dotenv  # the anthropic SDK: imported by make_client()

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000  # the longest reply one call may write
BASH_TIMEOUT = 120  # seconds
SUBAGENT_MAX_TURNS = 30  # model calls a child may make before it is stopped
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
# Seconds the server may stay silent (while streaming: between two events) before a try is given up.
API_TIMEOUT = 60
API_RETRIES = 2  # more tries the SDK gives a failed call: timeouts, lost connections, 429, 529, 5xx
MAX_MODEL_CALLS = 50  # model calls one turn may make before it is stopped (a weak model may loop)
# main() reads the four above from the environment or .env too: a slow local server needs a longer
# API_TIMEOUT, a small model that loops fewer MAX_TOKENS.
QUIET_SECONDS = 5  # a call still silent after this long says so
WORKDIR = Path.cwd()
STAGE = "s04"
PROMPT = f"{STAGE} >> "

# Built by main(), never at import, so that importing a stage has no side
# effects. Tests put a scripted model here.
client = None

# Each transcript line says which run of the stage (one random id per process) and which of your
# turns (run_turn counts them, from 1) it belongs to.
SESSION = secrets.token_hex(4)
turn_number = 0

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
        "description": "Replace `old_text`, which must occur exactly once in the file, "
                       "with `new_text`.",
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
        "Hand a self-contained sub-task (exploring code, a focused change) to a subagent. It "
        "starts with an empty context, has your tools except task, and returns only a summary "
        "of its work."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "prompt": {"type": "string",
                       "description": "all the subagent needs to know: it sees nothing else"},
            "description": {"type": "string", "description": "a short label to show the user"},
        },
        "required": ["prompt"],
    },
}
PARENT_TOOLS = CHILD_TOOLS + [TASK_TOOL]  # the child never gets task: no recursion, by construction


# -- the subagent: a child agent with a fresh context, blocking, no recursion -----


def run_subagent(prompt: str, task: str | None = None) -> str:
    """Run a child agent on `prompt` in a fresh conversation; block until it is done.

    Returns only the child's final text; its messages are thrown away. It has
    CHILD_TOOLS (the same fences as the parent, but no task) and at most
    SUBAGENT_MAX_TURNS model calls. `task` is the id of the task call, for the transcript.
    """
    messages = [{"role": "user", "content": prompt}]
    started, tokens, tools_used = time.monotonic(), 0, collections.Counter()
    final_text, last_text, turns = None, "", 0
    try:
        while final_text is None and turns < SUBAGENT_MAX_TURNS:
            response = call_model(messages, CHILD_TOOLS, child_system_prompt(), "child", task)
            turns += 1
            tokens += context_tokens(response.usage) + response.usage.output_tokens
            tools_used.update(block.name for block in response.content if block.type == "tool_use")
            last_text = text_of(response.content) or last_text
            final_text = take_reply(messages, response, CHILD_TOOLS, indent="    ")
    except Exception as error:  # noqa: BLE001 - the parent model is told why its child stopped
        raise RuntimeError(f"the subagent stopped: {describe_error(error)}") from None
    finally:  # for the terminal only: the parent model never sees this line
        used = ", ".join(f"{name} x{times}" for name, times in tools_used.items()) or "no tools"
        took = f"{time.monotonic() - started:.1f}s"
        print(dim(f"    = subagent: {count(turns, 'turn')}, {used}, {took}, {tokens:,} tokens"))
    if final_text is None:
        return f"(the subagent stopped after {SUBAGENT_MAX_TURNS} turns without finishing.) " + (
            f"Its last text: {last_text}" if last_text else "It left no text.")
    return final_text or "(subagent returned no text)"


def run_task(prompt: str, description: str = "") -> str:
    return run_subagent(prompt, running_call_id)  # the description is only a label for the user


# The id of the tool call being run. A tool's handler gets only the arguments the model wrote, so
# run_tool keeps the id here; run_task passes it to run_subagent, and each transcript line of the
# child names the task that started it ("task"), so two tasks of one turn are told apart.
running_call_id = None


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


# -- fence 2: a speed bump that explains -----------------------------------------
# check_command splits a command line into words as Python's shlex does and judges each simple
# command by its program and arguments: words, never substrings, so `grep -rn sudo .` is fine.
# What it cannot read it refuses, saying what to write instead. The wall (fence 3) is the boundary.


REFUSED_PROGRAMS = {
    **dict.fromkeys(["sudo", "sudoedit", "su", "doas", "pkexec", "run0"], "changes privileges"),
    **dict.fromkeys(["shutdown", "reboot", "halt", "poweroff"], "turns the machine off"),
    **dict.fromkeys(["mkfs", "mke2fs", "mkswap", "wipefs", "blkdiscard", "shred"], "erases a disk"),
    **dict.fromkeys(["fdisk", "sfdisk", "gdisk", "sgdisk", "parted"], "repartitions a disk"),
    "function": "defines a function (a fork bomb is one); write a script file instead",
    "alias": "defines an alias, which hides what a later command runs; write commands out",
}
SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "source", "."}
INTERPRETERS = {"python": "c", "node": "ep", "nodejs": "ep", "perl": "eE", "ruby": "e", "php": "r",
                "awk": "", "gawk": ""}  # -> the letters of their inline-code options (awk: none)
STARTS_PROGRAMS = re.compile(  # calls that start other programs, in the interpreters' languages
    r"\b(os\.(system|popen|exec\w*|spawn\w*|posix_spawn\w*|fork)|subprocess|child_process|pty"
    r"|Open3|shell_exec|passthru|proc_open|pcntl_exec|readpipe)\b"
    r"|(?<![\w./$])(system|exec|spawn|popen|fork)\b|%x[({\[]")
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "coproc"}
WRAPPERS = {  # they run the command after their options -> the options that take a value
    "env": {"-u"}, "time": {"-f", "-o"}, "nice": {"-n"}, "timeout": {"-s", "-k"}, "exec": {"-a"},
    "xargs": {"-I", "-n", "-P", "-L", "-d", "-a"}, "nohup": set(), "setsid": set(),
    "command": {"-v", "-V"},  # `command -v NAME` only asks where NAME is: it takes NAME as a value
}
SYSTEM_DIRS = {"bin", "boot", "dev", "etc", "home", "lib", "opt", "proc", "root", "sbin", "sys",
               "usr", "var", "Users", "System", "Library"}
DEVICES = {"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/urandom", "/dev/fd/1",
           "/dev/fd/2"}  # devices it is fine to write to
FIND_NO_TESTS = {"-delete", "-depth", "-mindepth", "-maxdepth", "-xdev", "-mount"}  # find . -delete
POWER = {"0", "6", "poweroff", "reboot", "halt", "kexec", "suspend", "hibernate"}  # init 0
MAX_LENGTH = 10_000  # characters: a longer command belongs in a file
MAX_DEPTH = 8  # shells, evals and $(...) inside each other; real commands need two or three


def check_command(command: str, depth: int = 0) -> str | None:
    """Why this command line must not run, or None. A pure function: it never runs anything."""
    if len(command) > MAX_LENGTH:
        return f"it is over {MAX_LENGTH:,} characters; write a script with write_file and run it"
    if depth > MAX_DEPTH:
        return f"it nests shells, evals or $(...) more than {MAX_DEPTH} levels deep"
    try:
        for words, writes in split_commands(command):
            reason = check_writes(writes) or check_words(unwrap(words), depth)
            if reason:
                return reason
    except ValueError as unreadable:
        return f"the filter cannot read this command: {unreadable}"
    return None


def check_words(words: list, depth: int) -> str | None:
    """Judge one simple command by its program, and by the rule for that program if there is one."""
    if not words:
        return None
    program, args = words[0].rsplit("/", 1)[-1].lower(), words[1:]
    if "$" in program or "{" in program:
        raise ValueError(f"the program {program} is only known when it runs; write it out")
    if program in REFUSED_PROGRAMS or program.startswith("mkfs."):
        return f"{program} {REFUSED_PROGRAMS.get(program, 'formats a disk')}"
    if program in ("eval", "trap"):  # trap CODE SIGNAL: the signal is judged as a word of the code
        return check_command(" ".join(operands(args)), depth + 1)
    program = re.sub(r"^(python|pypy)[0-9.]*$", "python", program)  # python3.12 is python
    if program in SHELLS or program in INTERPRETERS:
        return check_code(program, args, depth)
    return RULES[program](args) if program in RULES else None


def check_code(program: str, args: list, depth: int) -> str | None:
    """A shell or an interpreter runs code: judge the code on its command line. Code it would read
    from standard input (a pipe, a heredoc, <(...)) the filter cannot see, so that is refused."""
    code = inline_code(program, args)
    if code is not None and code.startswith("$") and program not in ("awk", "gawk"):  # $1: a field
        raise ValueError(f"{program} runs {code}, which is only known when it runs")
    if code is not None and program in SHELLS:  # from a $(...) on, it was judged as an eval already
        return check_command(code.partition("$(")[0], depth + 1)
    found = STARTS_PROGRAMS.search(code) if code is not None else None
    if found:
        return f"{program}'s inline code starts other programs ({found[0]}); run them with bash"
    if code is not None:
        return None
    options, script = [arg for arg in args if arg[:1] in "-+"], operands(args)[:1]
    if script and script[0].startswith("$"):
        raise ValueError(f"{program} runs {script[0]}, which is only known when it runs")
    asks_version = {"--version", "--help", "-V"} | (set() if program in SHELLS else {"-v"})
    if not script and asks_version & set(args) or any(arg.startswith("-m") for arg in options):
        return None  # node -v, python -m json.tool: no code to read
    if not script or script[0] in ("-", "/dev/stdin") or program in SHELLS and "-s" in options:
        return (f"{program} reads its code from standard input, which the filter cannot see; write "
                "the code to a file with write_file, then run the file")
    return None  # a script file: the wall is what confines it


def inline_code(program: str, args: list) -> str | None:
    """The code given on the command line: bash -c CODE, python -c CODE, node -e CODE, perl -e
    CODE (or glued to its option: -c"CODE"), an awk program. None when there is none."""
    letters = "c" if program in SHELLS else INTERPRETERS[program]
    for i, arg in enumerate(args):
        short = arg[:1] in "-+" and arg[1:2] != "-" and set(arg[1:]) & set(letters)
        if short or arg.split("=")[0] in ("--eval", "--print"):
            after = operands(args[i + 1:])
            return after[0] if after else arg[2:]
    if program in ("awk", "gawk"):
        return next(iter(operands(args)), "")
    return None


def unwrap(words: list) -> list:
    """The command that really runs, without VAR=value, keywords, and wrappers and their options.
    What xargs runs gets one more argument, known only at run time: the input xargs adds."""
    i, added = 0, []
    while i < len(words) and (words[i] in KEYWORDS or words[i] in WRAPPERS
                              or re.match(r"[A-Za-z_]\w*=", words[i])):
        wrapper, i = words[i], i + 1
        while wrapper in WRAPPERS and i < len(words) and words[i][:1] == "-":
            i += 2 if words[i] in WRAPPERS[wrapper] else 1  # an option that takes a value
        if wrapper == "timeout":
            i += 1  # the duration
        if wrapper == "xargs":
            added = ["$input"]
    command = words[i:]
    if added and not command:
        command = ["echo"]  # xargs alone runs echo
    return command + added


def operands(args: list) -> list:
    """The arguments that are not options (-rf, --force); after `--`, all of them."""
    cut = args.index("--") if "--" in args else len(args)
    return [arg for arg in args[:cut] if arg[:1] != "-" or arg == "-"] + args[cut + 1:]


PLACES = INSIDE, WORKSPACE, OUTSIDE, UNKNOWN, SYSTEM = (  # where a path leads, harmless first
    "inside", "the whole workspace", "files outside the workspace", "files known only at run time",
    "system files")


def place(word: str) -> str:
    """Where a path argument leads, from its spelling alone (links on disk are the wall's business).
    A last part `*` or `.*` stands for its folder; {a,b} for the worse of a and b."""
    word = os.path.expanduser(word).rstrip("/") or "/"  # build/ is build; */ is *
    before, brace, rest = word.partition("{")
    inside, _, after = rest.partition("}")
    if brace and "," in inside and "{" not in after and inside.count(",") < 50:
        return max((place(before + part + after) for part in inside.split(",")), key=PLACES.index)
    if brace and "," in inside or any(char in word for char in "$`") or word.startswith("~"):
        return UNKNOWN
    folder, _, last = word.rpartition("/")
    workspace = os.path.normpath(WORKDIR)
    path = os.path.normpath(os.path.join(workspace, folder + "/" if last in ("*", ".*") else word))
    path = "/" + path.lstrip("/")  # normpath keeps the // of //etc
    if path == workspace:
        return WORKSPACE
    if path.startswith(workspace + "/"):
        return INSIDE
    return SYSTEM if path == "/" or path.split("/")[1] in SYSTEM_DIRS else OUTSIDE


def check_writes(targets: list) -> str | None:
    """Why writing to these must not happen: devices and system files."""
    for target in targets:
        if place(target) == SYSTEM and os.path.normpath(target) not in DEVICES:
            return f"writes to {target}, a device or system file"
    return None


def check_rm(args: list) -> str | None:
    options = "".join(arg for arg in args if arg[:1] == "-" and arg[1:2] != "-")
    recursive = "r" in options.lower() or any(arg.startswith("--r") for arg in args)
    for target in operands(args):
        where = place(target)
        if where == SYSTEM or recursive and where != INSIDE:
            return f"rm {target} deletes {where}"
        if recursive and os.path.basename(os.path.normpath(target)) == ".git":
            return f"rm {target} deletes the repository's history"
    return None


def check_find(args: list) -> str | None:  # what -exec runs is judged as a command of its own
    starts = list(itertools.takewhile(lambda arg: arg[:1] not in ("-", "(", "!"), args)) or ["."]
    places = {place(start) for start in starts}
    acts = {"-delete", "-exec", "-execdir", "-ok", "-okdir"} & set(args)
    if acts and places - {INSIDE, WORKSPACE}:
        return f"find {' '.join(starts)} deletes or runs commands outside the workspace"
    tests = [arg for arg in args[len(starts):] if arg[:1] == "-" and arg not in FIND_NO_TESTS]
    if "-delete" in args and WORKSPACE in places and not tests:
        return "find -delete with no test deletes the whole workspace; add a test such as -name"
    return None


def check_owner_or_mode(args: list) -> str | None:  # chmod, chown, chgrp [-R] MODE_OR_OWNER PATH...
    places = {place(path) for path in operands(args)[1:]}
    recursive = "-R" in args or "--recursive" in args
    if SYSTEM in places or recursive and UNKNOWN in places:
        return "changes owners or modes of system files, or recursively where it cannot tell"
    return None


def check_power(args: list) -> str | None:  # init 0, systemctl poweroff, loginctl suspend
    return "turns the machine off, or suspends it" if POWER & set(args) else None


def check_in_place_edit(args: list) -> str | None:  # sed -i, perl -i: they write their files
    if any(arg.startswith(("-i", "--in-place")) or arg[:1] == "-" and "i" in arg for arg in args):
        return check_writes(operands(args))
    return None


RULES = {  # program -> a function of its arguments that says why not, or None
    "rm": check_rm, "find": check_find, "sed": check_in_place_edit,
    **dict.fromkeys(["chmod", "chown", "chgrp"], check_owner_or_mode),
    "kill": lambda args: "kills every process" if {"-1", "1"} & set(map(str.strip, args)) else None,
    **dict.fromkeys(["init", "telinit", "systemctl", "loginctl"], check_power),
    "dd": lambda args: check_writes([arg[3:] for arg in args if arg.startswith("of=")]),
    **dict.fromkeys(["tee", "truncate", "mv"], lambda args: check_writes(operands(args))),
    **dict.fromkeys(["cp", "ln", "install"], lambda args: check_writes(operands(args)[-1:])),
}


# Reading a command line: the machinery under check_command, safe to skip on a first reading.
# All the rules need is that split_commands("echo ok; sudo ls") gives two simple commands.

OPERATORS = re.compile(r"<<<|<<|>>|&>>|&>|>&|<&|>\||[<>]\(|&&|\|\||;;|\|&|[;&|()<>\n]")
REDIRECTS = {"<", "<<<", "<&", ">", ">>", ">|", "&>", "&>>", ">&"}  # a file name follows
ARITHMETIC = re.compile(r"(?<!\\)\$?\(\([\w \t+\-*/%<>=!,?:^~&|$;\[\]]*\)\)")  # $((1 + $x))
HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(['\"]?)([A-Za-z_]\w*)\2(?![\w'\"])")  # <<'EOF'


def split_commands(line: str) -> list:
    """The simple commands of a command line, each (words, files it writes to). Operators such as
    ; | && ( ) and newlines separate them; so do { } and find's -exec."""
    if "$'" in line:
        raise ValueError("$'...' quotes differ in bash; write the text in plain quotes")
    line = re.sub(r"`([^`]*)`", r"$(\1)", line.replace("\\\n", ""))  # `...` is $(...); \ joins
    line = cut_heredocs(ARITHMETIC.sub("0", line))  # arithmetic runs nothing
    commands, outer, words, writes, redirect = [], [], [], [], None
    for token in lexer(line):
        if "$(" in token:  # in quotes: it runs the same
            commands.append((["eval", token[token.index("$(") + 2:]], []))
        if token in ("{", "}", "-exec", "-execdir", "-ok", "-okdir"):  # a command starts after it
            if token.startswith("-"):
                words.append(token)  # find needs to know that it runs a command
            commands.append((words, writes))
            words, writes = [], []
            continue
        if token.strip(";&|()<>\n") or not token:  # a word ('' is one too)
            if not redirect:
                words.append(token)
            elif ">" in redirect:
                writes.append(token)
            redirect = None
            continue
        for op in OPERATORS.findall(token):
            if op == "<<":
                raise ValueError("it has a heredoc the filter cannot read; use write_file")
            if op == "(" and len(words) == 1 and not words[0].endswith(("$", "=")):  # name (
                raise ValueError(REFUSED_PROGRAMS["function"])
            if op in REDIRECTS and words and words[-1].isdigit():
                words.pop()  # the 2 of 2>&1 names a file descriptor
            if op in REDIRECTS:
                redirect = op
            elif op.endswith("("):  # $( ... ), <( ... ): the words around them are one command
                outer.append((words, writes))
                words, writes = [], []
            elif op == ")" and outer:
                commands.append((words, writes))
                words, writes = outer.pop()
            elif words or writes:
                commands.append((words, writes))
                words, writes = [], []
    found = [*commands, (words, writes), *outer]
    return [(words, writes) for words, writes in found if words or writes]


def cut_heredocs(line: str) -> str:
    """Heredoc bodies are input, not commands: cut each one out, leaving a here-string (<<<) in its
    place. A << in quotes ends the search: the quoted $(...) around it is read again on its own."""
    kept, start = [], 0
    found = HEREDOC.search(line)
    while found:
        end_of_line = (line + "\n").index("\n", found.end())
        try:
            operators = list(lexer(line[start:end_of_line], comments=True)).count("<<")
        except ValueError:  # an open quote: the << is inside it
            break
        if operators != 1:
            raise ValueError("it has << in a comment, or two heredocs on one line")
        tabs = "\t*" if found[1] else ""
        end = re.compile(f"^{tabs}{found[3]}$", re.MULTILINE).search(line, end_of_line + 1)
        if not end:
            raise ValueError(f"the heredoc <<{found[3]} has no end line")
        if not found[2] and re.search(r"\$\(|`", line[end_of_line:end.start()]):
            raise ValueError("the heredoc runs $(...) or `...`; write <<'EOF' if it should not")
        kept.append(line[start:found.start()] + "<<< ''" + line[found.end():end_of_line + 1])
        start = end.end()
        found = HEREDOC.search(line, start)
    return "".join(kept) + line[start:]


def lexer(line: str, comments: bool = False) -> shlex.shlex:
    """Words as bash quotes them (shlex, posix); operators and newlines are tokens of their own.
    In bash a # starts a comment only at the start of a word, and not inside ${...}; shlex cuts
    words at any #, so comments are read only where every # follows a blank, and no ${ is near."""
    words = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>\n")
    words.whitespace, words.whitespace_split = " \t", True
    words.commenters = "#" if comments or not re.search(r"[^ \t\n]#|\$[{\[]", line) else ""
    return words


# -- fence 3: the wall: the operating system confines every command --------------
# With bubblewrap (Linux) a command sees the system read-only and the workspace writable, except
# what runs later outside the wall; the home folder is hidden but for the programs on PATH; the
# network is off unless NETWORK=on; /tmp, /var/tmp and /run are private; it gets its own process,
# IPC and user namespaces, no capabilities, and LIMITS. Without the wall no command runs, unless
# SANDBOX=off.


RUNS_LATER = [  # in the workspace, run or read later outside the wall: by git, a shell, an editor
    ".git/hooks", ".git/config", ".git/commondir", ".git/modules", ".gitmodules", ".husky", ".env",
    ".envrc", ".bashrc", ".bash_profile", ".profile", ".zshrc", ".zprofile", ".zshenv", ".vscode",
    ".idea",
]
SECRET_HOMES = {".ssh", ".aws", ".gnupg", ".docker", ".kube", ".config", ".local", ".netrc"}
MAX_PROCESSES = 512
MAX_MEMORY = 4 * 2**30  # bytes of memory one process may map
MAX_FILE = 2**30  # bytes one file may reach; each folder kept in memory (/tmp ...) holds as much
LIMITS = f"ulimit -u {MAX_PROCESSES} -v {MAX_MEMORY // 1024} -f {MAX_FILE // 1024}"  # in KiB
LIMIT_SIGNS = {  # what a failing program prints when it meets one of the limits -> the limit
    "Resource temporarily unavailable": f"{MAX_PROCESSES} processes",
    "can't start new thread": f"{MAX_PROCESSES} processes",
    "Cannot allocate memory": f"{MAX_MEMORY // 2**30} GiB of memory per process",
    "MemoryError": f"{MAX_MEMORY // 2**30} GiB of memory per process",
    "File size limit exceeded": f"{MAX_FILE // 2**30} GiB per file",
    "File too large": f"{MAX_FILE // 2**30} GiB per file",
    "No space left on device": f"{MAX_FILE // 2**30} GiB in /tmp",
}
IN_MEMORY = [arg for folder in ("/tmp", "/var/tmp", "/run", "/dev/shm")
             for arg in ("--size", str(MAX_FILE), "--tmpfs", folder)]
WALL = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *IN_MEMORY,
        "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
NO_WALL = ("the wall cannot go up ({problem}). Install bubblewrap (apt install bubblewrap), or "
           "set SANDBOX=off to run commands with only the filter in front of them")


def sandbox_off() -> bool:
    return os.environ.get("SANDBOX", "").lower() == "off"


def network_on() -> bool:
    return os.environ.get("NETWORK", "").lower() == "on"


@functools.cache
def bwrap_problem() -> str | None:
    """Try bubblewrap once: is it installed, and can it start here (not on macOS, nor in every
    container)? None when it can."""
    try:
        probe = subprocess.run([*WALL, "--", "true"], capture_output=True, timeout=10, check=False)
    except OSError as error:
        return f"bubblewrap cannot start: {error.strerror}"
    if probe.returncode:
        return f"bubblewrap cannot start: {probe.stderr.decode(errors='replace').strip()}"
    return None


def walled(command: str) -> list:
    """bash running `command` inside the wall. Order matters: each mount covers those before it."""
    workspace, home = str(WORKDIR.resolve()), os.path.expanduser("~")
    wall = [*WALL, "--share-net"] if network_on() else [*WALL]
    wall += ["--size", str(MAX_FILE), "--tmpfs", home]  # the home folder is hidden...
    for folder in bound_back(home):  # ...but for what programs need
        wall += ["--ro-bind-try", folder, folder]
    resolver = os.path.realpath("/etc/resolv.conf")  # under /run on some systems
    wall += ["--ro-bind-try", resolver, resolver, "--bind", workspace, workspace]
    for path in protected_paths():
        wall += ["--ro-bind-try", str(path), str(path)]
    for env_file in {find_dotenv(), *map(str, WORKDIR.resolve().glob(".env*"))}:
        wall += ["--ro-bind", "/dev/null", env_file] if os.path.isfile(env_file) else []
    group = process_group()
    in_group = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group] if group else []
    return [*in_group, *wall, "--chdir", workspace, "--", "bash", "-c", f"{LIMITS}\n{command}"]


def bound_back(home: str) -> list:
    """What the hidden home folder keeps: ~/.gitconfig, and the folders of the programs on PATH.
    A tool's own hidden folder is kept whole (pyenv needs ~/.pyenv, not just its bin/), unless it
    holds secrets too (~/.config, ~/.local ...). Elsewhere (~/projects/app/.venv/bin) only the
    folder around bin/ is kept: the rest of ~/projects holds other projects' secrets."""
    folders = [os.path.join(home, ".gitconfig")]
    for folder in map(os.path.normpath, os.environ.get("PATH", "").split(os.pathsep)):
        if not folder.startswith(home + os.sep):
            continue
        top = os.path.join(home, folder[len(home) + 1:].split(os.sep)[0])
        if os.path.basename(top).startswith(".") and os.path.basename(top) not in SECRET_HOMES:
            folders.append(top)
        elif os.path.basename(folder) == "bin" and os.path.dirname(folder) not in (home, top):
            folders.append(os.path.dirname(folder))  # a virtual environment, say
        else:
            folders.append(folder)
    return folders


def protected_paths() -> list:
    """What runs, or is read as settings, later and outside the wall: RUNS_LATER in the
    workspace, the stage's own file, and the Python it runs on (a venv's .pth files run too)."""
    workspace = WORKDIR.resolve()
    return [*(workspace / name for name in RUNS_LATER), Path(__file__).resolve(),
            Path(sys.prefix).resolve()]


@functools.cache
def process_group() -> str | None:
    """A cgroup that holds commands to MAX_PROCESSES processes, where one can be made: for root,
    whom `ulimit -u` does not bind. Every agent on the machine shares it. None elsewhere."""
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        group = Path(root, "coding-agent")
        try:
            group.mkdir(exist_ok=True)
            (group / "pids.max").write_text(str(MAX_PROCESSES))
            return str(group)
        except OSError:  # not allowed, or no pids controller here
            continue
    return None


def identities() -> dict:
    """What .git and each RUNS_LATER path are right now: (device, inode), or None."""
    found = {}
    for name in [".git", *RUNS_LATER]:
        try:
            found[name] = (os.lstat(WORKDIR / name).st_dev, os.lstat(WORKDIR / name).st_ino)
        except OSError:
            found[name] = None
    return found


def remove_planted(before: dict) -> list:
    """Remove what a command put in the place of .git or of a RUNS_LATER path: renaming the folder
    above one gets past its read-only mount. A new repository (git init) keeps its own .git."""
    after, report = identities(), []
    for name in [".git", *RUNS_LATER]:
        path, git = WORKDIR / name, WORKDIR / ".git"
        unchanged = after[name] in (None, before[name]) or not os.path.lexists(path)
        git_init = name.startswith(".git") and before[".git"] is None and git.is_dir()
        if unchanged or git_init and not git.is_symlink():
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            report.append(f"removed {name}")
        except (OSError, RecursionError) as error:
            report.append(f"could not remove {name} ({type(error).__name__})")
    return report


def check_door(file: Path, writing: bool) -> None:
    """The file tools keep the wall's doors too: what runs later is not written, a .env not read."""
    if writing and any(file == path or file.is_relative_to(path) for path in protected_paths()):
        raise PermissionError(f"{file.name} runs or is read later, outside the wall; ask the user")
    if file.name.startswith(".env"):
        raise PermissionError(f"{file.name} holds secrets such as the API key; it is not shown")


# -- fence 4: a bash tool that cannot be wedged ------------------------------------


PASSED_ON = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
             "NO_COLOR", "COLORTERM", "VIRTUAL_ENV", "PYENV_VERSION"}


def command_env() -> dict:
    """The command's environment: an allow-list of what programs need to run, so no secret of the
    agent's (keys, tokens, passwords in URLs) reaches it, whatever the variable is called."""
    return {name: value for name, value in os.environ.items()
            if name in PASSED_ON or name.startswith("LC_")}


def read_output(process) -> tuple:
    """Read the command's output until it ends, passes MAX_OUTPUT, or time runs out: (bytes, why
    it was stopped, or None). The shell's exit ends the read even if a background child still
    holds the pipe open."""
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


# -- the tools: read, write and edit files, list a folder --------------------------


FILE_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
              (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]


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
    check_door(file, writing=False)
    check_kind(file, path)
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    try:
        # Text mode decodes as it reads: a character split between two reads is completed by the
        # second. newline="": \r\n is shown as it is.
        with open(file, encoding="utf-8", newline="") as opened:
            text = read_start(opened, limit)
            more = opened.read(1) != ""
            size = os.fstat(opened.fileno()).st_size
        if "\0" in text:
            raise UnicodeError
    except UnicodeError:
        size = file.stat().st_size
        problem = f"{path} is a binary or non-UTF-8 file ({size:,} bytes); not shown"
        raise ValueError(problem) from None
    if not more:
        return text
    left = size - len(text.encode())  # the rest was never read: the file's size says how big it is
    return text + ("" if text.endswith("\n") else "\n") + f"... [{left} more bytes not shown]"


def write_atomically(file: Path, text: str) -> None:
    """Write `text` to a new file beside `file`, then rename it over `file` in one step.

    Until the rename the old file is untouched, so a failed write leaves it as it was. And
    the name gets a new file of its own: a hard link's other name keeps the old content.
    """
    target = file.resolve()  # through a symlink, as open() goes: the file it points to is replaced
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(f"{file} is read-only")
    temp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        # "x": a new file, with the usual permissions.
        with open(temp, "x", encoding="utf-8", newline="") as out:
            if target.exists():  # keep its permission bits: a script stays executable
                os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
            out.write(text)  # newline="": write exactly what was given
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a crash cannot leave it empty
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_file(path: str, content: str) -> str:
    file = safe_path(path)
    check_door(file, writing=True)
    if file.exists():
        check_kind(file, path)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(file, content)
    return f"wrote {len(content):,} characters to {path}"


def edit_file(path: str, old_text: str, new_text: str) -> str:
    file = safe_path(path)
    check_door(file, writing=True)
    check_kind(file, path)
    text = file.read_bytes().decode("utf-8")  # bytes, so that \r\n line ends survive the edit
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    found = text.count(old_text)
    if found == 0:
        raise ValueError(f"old_text not found in {path}; read the file and copy the text exactly")
    if found > 1:
        raise ValueError(f"old_text occurs {found} times in {path}; "
                         "add surrounding lines so it matches once")
    write_atomically(file, text.replace(old_text, new_text))
    return f"edited {path}"


def list_dir(path: str = ".") -> str:
    folder = safe_path(path)
    check_kind(folder, path, "a folder")
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return cap("\n".join(entries)) or "(empty folder)"


JSON_TYPES = {"string": str, "integer": int}


def check_args(schema: dict, args: dict) -> str | None:
    """Say what is wrong with the model's arguments for a tool, or None if they fit its schema."""
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        spec = schema["properties"].get(name)
        if spec is None:
            takes = ", ".join(schema["properties"])
            return f"unexpected argument {name!r}; this tool takes {takes}"
        if not isinstance(value, JSON_TYPES[spec["type"]]) or isinstance(value, bool):
            return f"argument {name!r} must be of type {spec['type']}, not {type(value).__name__}"
    return None


# -- the loop: call the model, run the tools it asks for, until it stops ---------


def agent_loop(messages: list) -> str:
    """Call the model and run its tools until it stops; return its final text. A model that never
    stops (a weak one can loop) is stopped after MAX_MODEL_CALLS calls."""
    for _ in range(MAX_MODEL_CALLS):
        response = call_model(messages, PARENT_TOOLS, system_prompt())
        show_usage(response.usage)
        final_text = take_reply(messages, response, PARENT_TOOLS)
        if final_text is not None:
            return final_text
    raise TurnFailed(f"the model made {MAX_MODEL_CALLS} calls without finishing (MAX_MODEL_CALLS); "
                     "ask for a smaller step")


def call_model(messages: list, tools: list, system: str, agent: str = "parent", task=None):
    """The one place the API is called; the reply's text is printed as it arrives. Each call is
    recorded in the transcript, also one that fails or is cut short (Ctrl-C, a signal)."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system,
        "messages": messages,
        "tools": tools,
        # The API's default, but some compatible servers offer no tools without it.
        "tool_choice": {"type": "auto"},
        "max_tokens": MAX_TOKENS,
        # Every call re-sends the whole conversation; caching makes the repeat cheap.
        "cache_control": {"type": "ephemeral"},
    }
    line = {"time": datetime.now(UTC).isoformat(), "seconds": None, "session": SESSION,
            "turn": turn_number, "agent": agent}
    if agent == "child":  # the id of the task call that started it: two children of a turn differ
        line["task"] = task
    line.update(request=request, response=None)
    started = time.monotonic()
    try:
        line["response"] = stream_reply(request, agent)
    except BaseException as error:  # recorded here, then passed on (run_turn handles it)
        line["error"] = describe_error(error)
        raise
    finally:
        line["seconds"] = round(time.monotonic() - started, 3)
        save_transcript(line)
    response = line["response"]
    if text_of(response.content) and agent == "parent":
        print()  # end the line the text streamed onto
    # A child's last answer shows as the task's result.
    elif text_of(response.content) and response.stop_reason == "tool_use":
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
        raise TurnFailed("the conversation no longer fits the model's context window; "
                         "start a new session")
    if reason is None:  # the stream ended before the server said why the reply stopped
        raise TurnFailed("the reply stopped midway (the server closed the stream); "
                         "check ANTHROPIC_BASE_URL")
    # The API rejects an empty text block sent back to it (some compatible servers write them),
    # and an empty assistant message would make every later request invalid.
    content = [block for block in response.content if block.type != "text" or block.text]
    if not content:
        print(dim(f"{indent}(the model sent an empty reply)"))
        content = [{"type": "text", "text": "(empty reply)"}]
    if messages[-1]["role"] == "assistant":  # the turn was paused: this reply continues it
        messages[-1]["content"] = [*messages[-1]["content"], *content]
    else:
        messages.append({"role": "assistant", "content": content})
    calls = [block for block in response.content if block.type == "tool_use"]
    if reason == "pause_turn":
        return None  # the API paused a long turn; sending it back as it is resumes it
    if reason == "max_tokens":
        print(dim("(the reply was cut off at max_tokens)"))
        if calls:  # a cut-off call may have lost arguments: answer it, never run it
            cut = "error: not run: your reply was cut off at max_tokens. Try a shorter call."
            results = [tool_result(block, cut, True) for block in calls]
            messages.append({"role": "user", "content": results})
            return None
    if reason == "tool_use" and calls:
        results = [run_tool(block, tools, indent) for block in calls]
        messages.append({"role": "user", "content": results})
        return None
    return text_of(response.content)


def run_turn(messages: list, user_text: str) -> None:
    """One turn of the conversation. On any failure, drop the turn so the history stays valid."""
    global turn_number
    turn_number += 1  # the transcript says which turn each call belongs to
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    # Nothing that goes wrong in a turn ends the session.
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001
        del messages[start:]
        print(f"\n{describe_error(error)}. This turn was dropped from the conversation "
              "(files it changed stay changed).")


def system_prompt() -> str:
    network = "on" if network_on() else "off; if a task needs it, ask the user to set NETWORK=on"
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly. Commands run in a sandbox, where "
        f"the network is {network}. Hand large explorations to the task tool, so that "
        "only their summary enters this conversation."
    )


class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""


# -- the tool: bash, and a tool_result for every tool_use -------------------------


def cap(text: str) -> str:
    """Cut text to MAX_OUTPUT characters, saying how much was cut."""
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"


def run_bash(command: str) -> str:
    """Run a checked command with bash in WORKDIR, inside the wall; return its output."""
    reason = check_command(command)
    if reason:
        raise PermissionError(f"refused, not run: {reason}. Find a safer way, or ask the user")
    if not sandbox_off() and bwrap_problem():
        raise PermissionError("not run: " + NO_WALL.format(problem=bwrap_problem()))
    before, removed = identities(), []
    process = subprocess.Popen(
        ["bash", "-c", command] if sandbox_off() else walled(command),
        cwd=WORKDIR, env=command_env(), stdin=subprocess.DEVNULL,
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
        removed = [] if sandbox_off() else remove_planted(before)  # even after Ctrl-C
    output = cap(data.decode(errors="replace"))
    if stopped:
        output += f"\n(stopped: {stopped}; the command and everything it started were killed)"
    elif exit_code:
        output += f"\n(exit code {exit_code})"
    met = [limit for sign, limit in LIMIT_SIGNS.items() if sign in output]
    if met and (stopped or exit_code) and not sandbox_off():
        output += f"\n(the command met the wall's limit of {' and '.join(dict.fromkeys(met))})"
    if removed:
        output += f"\n({'; '.join(removed)}: the command put it there, and it would run later)"
    return output or "(no output)"


TOOL_HANDLERS = {
    "bash": run_bash,
    "read_file": read_file,
    "write_file": write_file,
    "edit_file": edit_file,
    "list_dir": list_dir,
}


TOOL_HANDLERS["task"] = run_task  # the parent's extra tool; the child is never offered it


def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text),
            "is_error": is_error}


def dispatch(block, tools: list) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    schemas = {tool["name"]: tool["input_schema"] for tool in tools}
    if block.name not in schemas:
        problem = f"error: unknown tool {block.name!r}; the tools are {', '.join(schemas)}"
        return tool_result(block, problem, True)
    if not isinstance(block.input, dict):
        kind = type(block.input).__name__
        problem = f"error: a tool's input must be an object of arguments, not {kind}"
        return tool_result(block, problem, True)
    # null means "not given".
    args = {name: value for name, value in block.input.items() if value is not None}
    problem = check_args(schemas[block.name], args)
    if problem:
        return tool_result(block, f"error: {block.name}: {problem}", True)
    try:
        return tool_result(block, TOOL_HANDLERS[block.name](**args))
    except Exception as error:  # noqa: BLE001 - a failing tool is news for the model, not a crash
        return tool_result(block, f"error: {type(error).__name__}: {error}", True)


def run_tool(block, tools: list, indent: str = "") -> dict:
    """Run one tool call, showing the call and a glimpse of its result."""
    global running_call_id
    running_call_id = block.id  # for run_task: see running_call_id
    show_tool_call(block, indent)
    result = dispatch(block, tools)
    show_tool_result(result, indent)
    return result


# -- what you see: calls, results and usage on the screen (safe to skip) ---------


def dim(text: str) -> str:
    """Grey on a terminal; plain in a pipe or a file, or when NO_COLOR is set."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[2m{text}\033[0m"
    return text


def count(number: int, thing: str) -> str:
    """A number and its noun: "1 line", "2 lines"."""
    return f"{number:,} {thing}" if number == 1 else f"{number:,} {thing}s"


def shorten(line: str, width: int = 120) -> str:
    """A line cut to `width` characters, ending with … when something was cut."""
    return line if len(line) <= width else line[:width - 1] + "…"


def show_tool_call(block, indent: str = "") -> None:
    # Shown before it is checked: the input may be anything.
    arguments = block.input if isinstance(block.input, dict) else {"input": block.input}
    args = " ".join(str(value) for value in arguments.values()).replace("\n", " ")
    label = str(arguments.get("description") or "")  # any type may come: not checked yet
    print(dim(f"{indent}> {block.name}: {shorten(label or args)}"))


def show_tool_result(result: dict, indent: str = "") -> None:
    """A glimpse of a result (the model gets all of it): its first line; for an error or a failed
    command, its last lines, where a traceback says what went wrong."""
    # From stage 2 on, a tool that raises answers "error: PermissionError: refused, ...": drop the
    # Python words and keep the user's.
    text = re.sub(r"^error: \w+Error: ", "", result["content"])
    lines = [line for line in text.splitlines() if line.strip()] or [""]
    failed = result["is_error"] or lines[-1].startswith("(exit code")
    if not failed or len(lines) == 1:
        more = f" (+{count(len(lines) - 1, 'line')})" if len(lines) > 1 else ""
        print(dim(f"{indent}  {shorten(lines[0])}{more}"))
        return
    if len(lines) > 3:
        print(dim(f"{indent}  ({count(len(lines) - 3, 'line')} before)"))
    for line in lines[-3:]:
        print(dim(f"{indent}  {shorten(line)}"))


def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what it read from or wrote to the cache."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


def show_usage(usage) -> None:
    """One line per model call: how big the context is, and how much came from the cache."""
    cached = usage.cache_read_input_tokens or 0
    print(dim(f"[context {context_tokens(usage):,} tokens, {cached:,} read from cache; "
              f"output {usage.output_tokens:,}]"))


def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")


def valid_utf8(text: str) -> str:
    """Text the API can take. Python stands in for bytes that are not UTF-8 (in a file name, say)
    with lone surrogates, which cannot be sent; each becomes the replacement character."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


# -- the wire: streaming, the transcript, errors that name a cause (safe to skip) --


def stream_reply(request: dict, agent: str):
    """Send the request and print the parent's text as it streams in; return the whole reply.
    A server still silent after QUIET_SECONDS is said to be so: one line, not a frozen screen."""
    waiting = threading.Timer(QUIET_SECONDS, print, [dim(
        f"(no answer yet; a try is given up after {API_TIMEOUT}s, API_TIMEOUT. Ctrl-C cancels)")])
    waiting.start()
    events = 0
    try:
        with client.messages.stream(**request) as stream:
            try:
                for event in stream:
                    waiting.cancel()  # the server is talking
                    events += 1
                    if event.type == "text" and agent == "parent":  # a child's text shows later
                        print(event.text, end="", flush=True)
            except ValueError:  # the SDK could not parse a tool call's arguments (it quotes them)
                raise TurnFailed("a tool call's arguments are not valid JSON; try again, or check "
                                 "MODEL_ID (small models write broken calls)") from None
            if events == 0:  # the body held no server-sent events: nothing to build a reply from
                raise TurnFailed("the server answered a streamed request with plain JSON, not "
                                 "events; check ANTHROPIC_BASE_URL (the endpoint must stream)")
            return stream.get_final_message()
    finally:
        waiting.cancel()


def save_transcript(line: dict | None) -> None:
    """With TRANSCRIPT=file.jsonl set, append one JSON line per model call (the s01 note lists its
    fields). The key is not among them: the client sends it as a header. A file that cannot be
    written is said once and recording stops: a transcript is never worth a turn. main() calls
    this with None at start-up, to find that out before the first turn."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as file:
            if line is not None:
                as_plain = lambda sdk_object: sdk_object.model_dump(mode="json", exclude_none=True)
                file.write(json.dumps(line, default=as_plain) + "\n")  # the reply is an SDK object
    except OSError as error:
        del os.environ["TRANSCRIPT"]
        print(f"cannot write TRANSCRIPT={path} ({error.strerror or error}); recording is off")


def causes(error: BaseException):
    """The error, then each error behind it: the SDK's errors wrap the one that says why."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def why_unreachable(error: BaseException) -> str:
    """In words, why a try at reaching the server failed, from the errors behind the SDK's own."""
    for cause in causes(error):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (nothing listens at that address and port)"
        if isinstance(cause, socket.gaierror):
            return "unknown host name"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed ({cause.reason}): the server may speak http, not https"
        if isinstance(cause, TimeoutError):
            return f"no answer for {API_TIMEOUT}s"
    deepest = list(causes(error))[-1]
    return str(deepest) or type(deepest).__name__


def server_said(error) -> str:
    """The type and message in an error body ({"error": {"type", "message"}}), or its text."""
    body = error.body if isinstance(error.body, dict) else {}
    details = body.get("error")
    if isinstance(details, dict) and details.get("message"):
        return f"{details.get('type', 'error')}: {details['message']}"
    return shorten(error.response.text.strip(), 200) or "no message"


def describe_error(error: BaseException) -> str:
    """What ended a turn (or a model call), in words, naming the setting to check."""
    import anthropic  # loaded by make_client already (see there), so this costs nothing
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SystemExit):
        return "stopped by a signal (`timeout`, or the terminal was closed)"
    if isinstance(error, TurnFailed):
        return str(error)
    if isinstance(error, anthropic.APITimeoutError):
        return (f"API error: no answer in {API_TIMEOUT}s, {count(API_RETRIES + 1, 'time')}; "
                "check ANTHROPIC_BASE_URL, or raise API_TIMEOUT for a slow server")
    if isinstance(error, anthropic.APIConnectionError):
        return (f"API error: cannot reach {error.request.url}: {why_unreachable(error)}; "
                "check ANTHROPIC_BASE_URL")
    if isinstance(error, anthropic.APIStatusError):
        text = f"API error {error.status_code} ({server_said(error)})"
        if error.request_id:
            text += f", request {error.request_id}"
        if error.status_code in (400, 401, 403, 404):
            # From a proxy or a compatible provider these usually mean a wrong setting.
            text += "; check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID"
        return text
    if any(isinstance(cause, TimeoutError) for cause in causes(error)):  # not wrapped by the SDK
        return (f"API error: the reply stopped midway, nothing more for {API_TIMEOUT}s; "
                "check ANTHROPIC_BASE_URL, or raise API_TIMEOUT for a slow server")
    if isinstance(error, anthropic.APIError):
        return f"API error: {error}"
    return f"{type(error).__name__}: {error}"


# -- start-up ------------------------------------------------------------------


MISSING_KEY = """\
No API key: set ANTHROPIC_API_KEY, in the environment or in a .env file beside
this script (copy .env.example to .env and fill it in). For an
Anthropic-compatible provider also set ANTHROPIC_BASE_URL; MODEL_ID picks the
model. No key at all? `python tests/demo.py {stage}` shows this stage working
with a scripted model."""


class ShowRetries(logging.Handler):
    """Shows each retry as the SDK makes it, with its reason, from what the SDK logs (logger
    "anthropic"): at DEBUG level why a try failed, then "Retrying request to ... in N seconds"."""

    reason = "the try failed"

    def emit(self, record: logging.LogRecord) -> None:
        pattern = str(record.msg)  # the message before its %-arguments are filled in
        if record.exc_info:  # "Encountered Exception": the error of the try that failed
            self.reason = why_unreachable(record.exc_info[1])
        elif pattern == "Retrying due to status code %i":
            self.reason = f"the server answered {record.args[0]}"
        elif pattern.startswith("Retrying request to"):  # "... to %s in %f seconds"
            print(dim(f"(trying again in {record.args[1]:.1f}s: {self.reason})"), flush=True)


def base_url() -> str:
    # An empty ANTHROPIC_BASE_URL means "not set", which the SDK would not assume.
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"


def endpoint() -> str | None:
    """The host (and port) of ANTHROPIC_BASE_URL, to show; None if it is not an http(s) URL."""
    parts = urlsplit(base_url())
    with contextlib.suppress(ValueError):  # a port that is not a number
        if parts.scheme in ("http", "https") and parts.hostname:
            return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return None


def make_client():
    """Build the API client from the environment, or None when no key is set. The SDK is imported
    here, not at the top: importing it takes seconds, and the no-key message should not wait."""
    api_key = os.environ.get("ANTHROPIC_API_KEY")
    if not api_key:
        return None
    import anthropic
    sdk_log = logging.getLogger("anthropic")  # the SDK logs each retry here
    sdk_log.setLevel(logging.DEBUG)  # a retry's reason is logged at DEBUG level
    sdk_log.handlers = [ShowRetries()]  # one handler, however often a client is built
    sdk_log.propagate = False  # and only here: not on to Python's default handlers
    return anthropic.Anthropic(api_key=api_key, base_url=base_url(), timeout=API_TIMEOUT,
                               max_retries=API_RETRIES)


def number_setting(name: str, default: int) -> int:
    """A whole number from the environment (or .env), else the default; a wrong value is said."""
    value = os.environ.get(name, "").strip()
    if value.isdecimal():
        return int(value)
    if value:
        print(f"{name}={value!r} is not a whole number; using {default}")
    return default


def typed_so_far() -> str:
    """What was typed at the prompt when Ctrl-C came; readline keeps it ("" without readline)."""
    readline = sys.modules.get("readline")
    return readline.get_line_buffer() if readline else ""


def wall_state() -> str:
    """One line at start-up: what the wall holds back, or why commands will not run."""
    if sandbox_off():
        return dim("the wall is off (SANDBOX=off): only the filter stands in front of commands")
    if bwrap_problem():
        return f"No command will run: {NO_WALL.format(problem=bwrap_problem())}."
    network = "network on (NETWORK=on)" if network_on() else "network off (NETWORK=on)"
    return dim(f"the wall is on: read-only system, this folder writable, {network}, home hidden")


def main() -> int:
    global client, API_TIMEOUT, API_RETRIES, MAX_TOKENS, MAX_MODEL_CALLS
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show prints as "?"
    load_dotenv()
    API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
    API_RETRIES = number_setting("API_RETRIES", API_RETRIES)
    MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
    MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
    if endpoint() is None:
        print(f"ANTHROPIC_BASE_URL={base_url()!r} is not a URL: write it as http://host:port "
              "or https://host", file=sys.stderr)
        return 2
    if WORKDIR.resolve() in (Path("/"), Path.home().resolve()):
        print(f"Not starting in {WORKDIR}: there the workspace would hold the whole system or your "
              "home folder. Start the agent in a project folder.", file=sys.stderr)
        return 2
    client = make_client()
    if client is None:
        print(MISSING_KEY.format(stage=STAGE), file=sys.stderr)
        return 2
    print(wall_state())
    save_transcript(None)  # can it be written? If not, it says so now and recording is off
    transcript = os.environ.get("TRANSCRIPT")  # still set only if it can be written
    recording = f", recording each call in {transcript}" if transcript else ""
    print(dim(f"model {os.environ.get('MODEL_ID') or DEFAULT_MODEL} at {endpoint()}{recording}"))
    # `timeout` or a closed terminal: leave through every `finally`: a call cut short is recorded.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, frame: sys.exit(128 + number))
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            # Loading it gives input() line editing, and Up recalls earlier lines.
            import readline  # noqa: F401
    messages, warned = [], False
    while True:
        try:
            user_text = input(PROMPT)
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            if typed_so_far():  # as in bash: Ctrl-C throws away the line being typed
                warned = False
            elif warned:
                return 0
            else:
                print(dim("(press Ctrl-C again or type q to leave)"))
                warned = True
            continue
        warned = False
        if user_text.strip().lower() in ("q", "exit", "quit"):
            return 0
        if user_text.strip():
            run_turn(messages, user_text)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the prompt came (loading the SDK takes seconds)
        sys.exit(130)
