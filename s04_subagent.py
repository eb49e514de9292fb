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
import functools
import itertools
import json
import logging
import os
import re
import secrets
import select
import shlex
import signal
import socket
import ssl
import stat
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from dotenv import load_dotenv  # the anthropic SDK: imported by make_client(), with a key

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


# -- fence 2: a speed bump that explains -----------------------------------------
# check_command judges a command line's words as bash reads them, never substrings (`grep -rn sudo .` is fine).
# It refuses the usual dangerous commands, and what it cannot read, with a reason. The wall (fence 3) is the boundary.

REFUSED_PROGRAMS = {
    **dict.fromkeys(["sudo", "su", "doas", "pkexec", "run0"], "changes privileges"),
    **dict.fromkeys(["shutdown", "reboot", "halt", "poweroff", "kexec"], "powers off or restarts the machine"),
    **dict.fromkeys(["wipefs", "fdisk", "sfdisk", "cfdisk", "parted", "gdisk", "sgdisk", "blkdiscard", "mkswap"],
                    "erases or repartitions a disk"), "killall5": "kills every process",
}
SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "ash", "eval", "trap", "source", "."}  # run shell code
INTERPRETERS = {"python": "c", "node": "ep", "perl": "eE", "ruby": "e", "php": "rBRE"}  # -> letters of inline code
STARTS_PROGRAMS = re.compile(r"\b(system|passthru|shell_exec|proc_open|\w*[Pp]open|Open3|readpipe|\w*spawn\w*|fork\w*"
                             r"|pty|\w*exec(?:[lv]?p?e?|Sync|File\w*)|\w*subprocess\w*|child_process|qx)\b|`|%x[({\[]")
WRAPPERS = {  # they run the command after their options: {name: (short options that take a value, long ones)}
    "env": ("uCS", ["--unset", "--chdir", "--split-string"]), "time": ("fo", ["--format", "--output"]),
    "nice": ("n", ["--adjustment"]), "timeout": ("sk", ["--signal", "--kill-after"]), "exec": ("a", []),
    "stdbuf": ("ioe", ["--input", "--output", "--error"]),
    "xargs": ("aEdIsLnP", ["--arg-file", "--delimiter", "--max-chars", "--max-args", "--max-procs"]),
    **dict.fromkeys(["nohup", "setsid", "command", "builtin", "busybox"], ("", [])),
}
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "coproc"}
FIND_RUNS = {"-exec", "-execdir", "-ok", "-okdir"}  # find runs the command that follows, up to ; or +
SYSTEM_DIRS = {"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "opt", "proc", "root", "sbin", "sys",
               "usr", "var", "private", "Users", "System", "Library"}  # the folders in / that belong to the system
HARMLESS_DEVICES = {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty", "/dev/stdin", "/dev/stdout", "/dev/stderr"}
BRACES = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")  # {a,b} and {1..3} expand; {} alone does not
STDIN = ("-", "/dev/stdin", "/dev/fd/0")  # names for standard input
MAX_DEPTH = 8  # shells, evals and substitutions inside each other; real commands need two or three


def check_command(command: str, depth: int = 0) -> str | None:
    """Why this command line must not run, or None. A pure function: it never runs anything."""
    try:
        for simple in parse(command, depth)[0]:
            reason = check_writes([t for op, t in simple["redirects"] if ">" in op]) or check_words(simple, depth)
            if reason:
                return reason.replace("\0", "")  # a NUL marks an expansion (see parse): show none
    except (ValueError, RecursionError) as unreadable:  # RecursionError: a long chain of symlinks
        return f"the filter cannot read this command: {unreadable}".replace("\0", "")
    return None


def check_words(simple: dict, depth: int) -> str | None:
    """Judge one simple command by its program and arguments."""
    name, *args = unwrap(simple["words"]) or [""]  # [""]: nothing runs (VAR=value alone, `command -v rm`)
    if unreadable(name):
        raise ValueError(f"the program name {name} is only known when the command runs; write it out")
    program = program_name(name)
    if program in REFUSED_PROGRAMS:
        return f"{program} {REFUSED_PROGRAMS[program]}"
    if program.startswith(("mkfs", "mke2fs")):
        return f"{program} formats a disk"
    if program in SHELLS or program in INTERPRETERS:
        return check_code(program, args, simple, depth)
    if program == "find":  # its start folders come before the expression (-name, -delete, (, !)
        starts = [a for a in itertools.takewhile(lambda a: not re.match(r"-[a-z]|[(!]", a), args) if a[:1] != "-"]
        if {"-delete", *FIND_RUNS} & set(args) and {OUTSIDE, SYSTEM, UNKNOWN} & set(map(place, starts or ["."])):
            return f"find {' '.join(starts)} deletes or runs commands on files outside the workspace"
        commands = " ".join(";" if arg in {*FIND_RUNS, ";", "+"} else shlex.quote(arg) for arg in args)  # -exec CMD ;
        return check_command(f"true {commands}", depth + 1)  # find's own words, after true, run nothing
    return RULES[program](args) if program in RULES else None


def check_code(program: str, args: list, simple: dict, depth: int) -> str | None:
    """A shell, eval, trap, source or an interpreter runs code: judge it, or refuse what it cannot read."""
    script = operands(args)[:1]  # and stdin: the last of < FILE, << HEREDOC, <<< STRING (0< too)
    stdin = [(op.lstrip("0"), t) for op, t in simple["redirects"] if op.lstrip("0") in ("<", "<<", "<<<")][-1:]
    if program in ("eval", "trap"):  # trap CODE SIGNALS: the signal names are judged as words of the code
        codes = [" ".join(args[args[:1] == ["--"]:])]
    elif program in SHELLS:  # bash -o pipefail -c CODE NAME ARGS: its options (+e too) end at the first operand
        options, start = split_options([re.sub(r"^\+", "-", arg) for arg in args], 0, "oO", ["--rcfile", "--init-file"])
        script = [] if has_flag(options, "s") else args[start:start + 1]  # -s: the code comes from stdin
        codes = args[start:] if has_flag(options, "c") else []  # every operand is judged as code, to be safe
    else:  # python -c CODE, -cCODE, perl -e CODE, node -pe CODE (letters alone take the next word), --eval=CODE
        codes = [match[1] or match[2] or "".join(args[i + 1:i + 2]) for i, arg in enumerate(args) if (match := re.fullmatch(
            rf"-[a-zA-Z]*?[{INTERPRETERS[program]}](?![a-zA-Z]+$)(.*)|--(?:eval|print)=?(.*)", arg, re.DOTALL))]
    script = [a for a in script if a not in STDIN] or [t for op, t in stdin if op == "<" and t not in STDIN]
    if not codes and (script or program == "python" and has_flag(args, "m")
                      or {"--version", "--help", "-V"} & set(args[:1])):  # a script (bash < x too), or it exits
        if script and unreadable(script[0]):
            raise ValueError(f"{program} runs {script[0]}, which is only known when the command runs")
        return None
    if not codes and not [op for op, _ in stdin if op != "<"]:
        raise ValueError(f"{program} reads its code from a pipe or stdin, which the filter cannot see")
    code = "\n".join(codes) or "".join(t for op, t in stdin if op != "<")  # a heredoc or a <<< string
    if "\0" in code:
        raise ValueError(f"{program} runs code that is only known when the command runs")
    if program in INTERPRETERS and (starts := STARTS_PROGRAMS.search(code)):
        raise ValueError(f"{program}'s inline code starts other programs ({starts[0]}); run them with bash")
    return check_command(code, depth + 1) if program in SHELLS else None


def unwrap(words: list) -> list:
    """Strip what only runs the real command: VAR=value, keywords, and wrappers with their options."""
    i, xargs, replace = 0, False, None  # replace: xargs -I R, where R is
    while i < len(words) and (words[i] in KEYWORDS or (name := program_name(words[i])) in WRAPPERS
                              or re.match(r"[A-Za-z_]\w*\+?=", words[i])):  # after `time` too: time ! cmd
        if words[i] in KEYWORDS or name not in WRAPPERS:
            i += 1
            continue
        options, i = split_options(words, i + 1, *WRAPPERS[name])
        if name == "command" and has_flag(options, "vV"):
            return []  # `command -v rm` only asks where rm is
        if name == "env" and has_flag(options, "S", "--split-string"):
            raise ValueError("env -S builds the command from one string; write the command out")
        while name == "env" and i < len(words) and ("=" in words[i] or words[i] == "-"):
            i += 1  # env's own NAME=value, and - (the same as -i)
        i += name == "timeout"  # the duration
        if name == "xargs":  # the input adds arguments; with -I R (-i: {}) it replaces R wherever R is
            xargs, replace = True, re.search(r"(?:(?:^| )-[^\s-]*?(?:I ?|i)|--rep[a-z]*=?)(\S*)", " ".join(options))
    if xargs and i < len(words):
        return [word + "\0" * bool(replace and (replace[1] or "{}") in word) for word in words[i:]] + ["\0(input)"]
    return words[i:]


def split_options(words: list, start: int, short_values: str, long_values: list) -> tuple:
    """A wrapper's options from `start`, and where its command begins: `-n5`, `-n 5`, `--sig KILL`, `--sig=KILL`."""
    i = start
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        option, i = words[i], i + 1
        if option == "--":
            break
        short = short_values and re.fullmatch(f"-[^-{short_values}]*[{short_values}]", option)  # -n 5, not -n5
        i += bool(short) or option[:2] == "--" and "=" not in option and any(n.startswith(option) for n in long_values)
    return words[start:i], i


def operands(args: list) -> list:
    """The arguments that are not options (-rf, --force), which GNU allows in any order; `--` ends options."""
    cut = args.index("--") if "--" in args else len(args)
    return [arg for arg in args[:cut] if arg[:1] != "-" or arg == "-"] + args[cut + 1:]


def has_flag(args: list, letters: str, long: str = "") -> bool:
    """Is one of these short letters in a cluster (-rf), or `long` spelled out or shortened (--recu)?"""
    return any(long.startswith(arg.split("=")[0]) if arg.startswith("--") and len(arg) > 2
               else arg[:1] == "-" and any(letter in arg[1:] for letter in letters) for arg in args)


def program_name(word: str) -> str:
    """`/usr/bin/../bin/RM` is rm (file systems may ignore case), `python3.12` is python."""
    return re.sub(r"^(python|pypy)[0-9.]*$", "python", word.rsplit("/", 1)[-1].lower())


def unreadable(word: str) -> bool:
    """Is this word only known at run time? A NUL marks $X and $(...); globs, {a,b} and a {} placeholder too."""
    return bool(re.search(r"[\0*?]|\{}", word)) or "]" in word.partition("[")[2] or bool(BRACES.search(word))


PLACES = INSIDE, WORKSPACE, OUTSIDE, UNKNOWN, SYSTEM = (  # where place() says an argument leads, harmless first
    "inside", "the whole workspace", "files outside the workspace", "files known only at run time", "system files")


def place(word: str) -> str:
    """Where an argument leads, resolved like safe_path resolves; a last part `*` or `.*` counts as its folder."""
    text, workspace = os.path.expanduser(word), os.path.realpath(WORKDIR)
    if braces := BRACES.search(text):  # {a,b}: the worst of the words it expands to (two braces: unknown)
        words = [text[:braces.start()] + one + text[braces.end():] for one in braces[0][1:-1].split(",")]
        return UNKNOWN if "{" in text[:braces.start()] + text[braces.end():] or "," not in braces[0] else max(
            map(place, words), key=PLACES.index)
    folder, slash, last = text.rpartition("/")
    if "\0" in text or text[:1] == "~":
        return UNKNOWN
    path = os.path.realpath(os.path.join(workspace, folder or slash or "." if last in ("*", ".*") else text))
    if os.path.commonpath([path, workspace]) == workspace:
        return WORKSPACE if path == workspace else INSIDE
    return SYSTEM if path == "/" or path.split("/")[1] in SYSTEM_DIRS else OUTSIDE


def check_writes(targets: list) -> str | None:
    """Why writing these must not happen: devices and system files. /dev/stderr and the like count as written."""
    return next((f"writes to {t}, a device or system file" for t in dict.fromkeys(targets) if place(t) == SYSTEM
                 and os.path.normpath(t) not in HARMLESS_DEVICES and not re.fullmatch(r"/dev/fd/[0-9]+", t)), None)


def check_rm(args: list) -> str | None:
    recursive, targets = has_flag(args, "rR", "--recursive"), dict.fromkeys(operands(args))  # each target once
    return next((f"rm {target} deletes {where}" for target in targets
                 if (where := place(target)) == SYSTEM or where != INSIDE and recursive), None)


def check_mode_change(args: list) -> str | None:  # chmod, chown, chgrp; the first operand is the mode or the owner,
    given = any(re.fullmatch(r"-[rwxXst]+|--ref.*", arg) for arg in args)  # unless an option gives it: -w, --reference
    mode_or_owner, *paths = [None] * given + [place(operand) for operand in dict.fromkeys(operands(args))] or [None]
    if has_flag(args, "R", "--recursive") and (mode_or_owner == SYSTEM or {SYSTEM, UNKNOWN} & set(paths)):
        return "changes owners or modes recursively in a system folder, or where the filter cannot tell"
    return None


def destination(args: list) -> list:  # cp, mv, ln, install: -t DIR, --target-directory=DIR, or the last operand
    given = [m[2] or "".join(args[i + 1:i + 2]) for i, arg in enumerate(args)
             if (m := re.fullmatch(r"(--t[a-z-]*=?|-[A-Za-z]*?t)(.*)", arg))]
    return given[:1] or operands(args)[-1:]


RULES = {  # program -> a function of its arguments that says why not, or None
    "rm": check_rm,
    **dict.fromkeys(["chmod", "chown", "chgrp"], check_mode_change),
    "kill": lambda args: "kills every process" if "-1" in args[1:] else None,
    **dict.fromkeys(["pkill", "killall"], lambda args: "kills every process" if {".", ".*", "^"} & set(args) else None),
    **dict.fromkeys(["init", "telinit"], lambda args: "powers off or reboots" if {"0", "6"} & set(args) else None),
    "systemctl": lambda args: "powers off the machine" if {"poweroff", "reboot", "halt", "kexec"} & set(args) else None,
    "dd": lambda args: check_writes([a.removeprefix("of=") for a in args if a.startswith("of=")]),
    **dict.fromkeys(["tee", "shred", "truncate"], lambda args: check_writes(operands(args))),
    "mv": lambda args: check_writes(operands(args) + destination(args)),  # the source is gone too
    **dict.fromkeys(["cp", "ln", "install"], lambda args: check_writes(destination(args))),
}


# Reading bash: the machinery under check_command, safe to skip on a first reading. All the rules need is
# that parse("echo ok; sudo ls")[0] is a list of two simple commands.

UNQUOTED = re.compile(r"""(?P<blank>[ \t]+|\(\([^()$`'"\\]*\)\)) | (?P<comment>\#) | (?P<quote>") | \\(?P<escape>.?)
    | (?P<descriptor>[0-9]+(?=(?:\\\n)*[<>])) | (?P<plain>[^ \t\n'"\\$`;&|()<>]+) | '(?P<single>[^']*)'?
    | (?P<unread>`|(?<!=)\((?:[ \t]|\\\n)*\)|\$\{[^}$'"]*['"]|\$\(\([^)$'"]*['"]) | (?P<expansion>\$\(\([^()$`'"\\]*\)\)
                    | \$\{[^}$`'"\\]*\} | \$'(?:[^'\\]|\\.)*'? | \$(?!\()(?:[A-Za-z_]\w*|[0-9@*#?$!{-]?))
    | (?P<substitution>\$\(|[<>]\() | (?P<heredoc><<-?[ \t]*(?P<delimiter>(?:[^\s'"\\<>|&;()]+|'[^']*'|"[^"]*"|\\\S)+))
    | (?P<newline>\n) | (?P<operator>&&|\|\||\|&|;;|&>>?|>>|>\||>&|<<<|<&|<>|[;&|()<>])""", re.VERBOSE | re.DOTALL)
QUOTED = re.compile(r"""(?P<plain>[^"\\$`]+|\\(?=[^"\\$`\n])) | \\(?P<escape>.?) | (?P<quote>")
    | (?P<unread>`|\$\{[^}$'"]*['"]|\$\(\([^)$'"]*['"]) | (?P<expansion>\$\(\([^()$`'"\\]*\)\) | \$\{[^}$`'"\\]*\}
                    | \$(?!\()(?:[A-Za-z_]\w*|[0-9@*#?$!{-]?)) | (?P<substitution>\$\()""", re.VERBOSE | re.DOTALL)
UNREAD = "backticks, functions, case and quotes inside ${...} or $((...)) are outside the part of bash the filter reads"


def parse(script: str, depth: int = 0, i: int = 0, nested: bool = False) -> tuple:
    """The simple commands a script runs, {"words": [...], "redirects": [(operator, target)]}, those in $(...) first,
    and where it ends (nested: after the ) that closes a $(...)). $X and $(...) stay in their words after a NUL."""
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests shells, evals or substitutions more than {MAX_DEPTH} levels deep")
    found, word, heredocs, parens, quoted, descriptor = [], [], [], 0, False, ""
    command, redirect = {"words": [], "redirects": []}, None

    def end_word():
        nonlocal redirect
        if not word:
            return
        text = "".join(word)
        word.clear()
        if text in ("function", "case") and set(command["words"][-1:]) <= KEYWORDS and not redirect:
            raise ValueError(UNREAD)
        command["redirects" if redirect else "words"].append((redirect, text) if redirect else text)
        redirect = None

    def end_command():
        end_word()
        if command["words"] or command["redirects"]:
            found.append(dict(command))
        command.update(words=[], redirects=[])

    while i < len(script):
        token = (QUOTED if quoted else UNQUOTED).match(script, i)
        kind, text, i = token.lastgroup, token[token.lastgroup], token.end()
        if kind == "escape" and text == "\n":  # a backslash before a newline: the line goes on
            continue
        if kind in ("plain", "single", "escape", "quote") or kind in ("comment", "descriptor") and word:  # "a"#b
            word.append("" if kind == "quote" else text)  # "" is a word too
            quoted ^= kind == "quote"
        elif kind == "expansion":
            word.append("\0" + text)
        elif kind == "substitution":  # $(...), <(...), >(...): the commands inside run first
            inner, i = parse(script, depth + 1, i, nested=True)
            found += inner
            word.append("\0$(...)")
        elif kind == "unread":
            raise ValueError(UNREAD)
        elif kind in ("blank", "comment", "descriptor"):  # 2 in 2>&1 names a file descriptor of the redirect
            end_word()
            descriptor = text if kind == "descriptor" else ""
            i = re.compile(r"[^\n]*").match(script, i).end() if kind == "comment" else i  # to the end of the line
        elif kind == "heredoc":  # its body starts on the next line; <<- takes the tabs off its lines
            end_word()
            name = shlex.split(token["delimiter"])[0]  # quoted in any way, nothing in the body runs
            tabs = "\t*" if text.startswith("<<-") else ""
            command["redirects"].append(heredoc := [descriptor + "<<", ""])  # in its place: the last stdin wins
            heredocs.append((heredoc, tabs + re.escape(name), name == token["delimiter"]))
        elif kind == "newline":
            end_command()
            for heredoc, delimiter, expands in heredocs:
                end = re.compile(f"^{delimiter}$", re.MULTILINE).search(script, i)
                body, i = (script[i:end.start()], end.end() + 1) if end else (script[i:], len(script))
                if expands and re.search(r"\$\(|`", body):  # they would run: quote the delimiter
                    raise ValueError("the heredoc runs $(...) or `...`; write <<'EOF' if it should not")
                heredoc[1] = "\0" * (expands and "$" in body) + body
            heredocs.clear()
        elif nested and text == ")" and parens == 0:
            if heredocs:  # its body would start on the next line, after this $(...) is over
                raise ValueError("a heredoc that starts inside $(...) has to end there too")
            end_command()
            return found, i
        elif text in (";", ";;", "&", "&&", "|", "|&", "||", "(", ")"):
            parens += (text == "(") - (text == ")")
            end_command()
        else:
            end_word()
            redirect, descriptor = descriptor + text, ""
    end_command()
    return found, i


# -- fence 3: the wall: the operating system confines every command --------------
# With bubblewrap (Linux), every command sees the whole file system read-only except
# WORKDIR, gets a private /tmp and its own PID namespace (nothing it starts outlives the
# call; it cannot see or signal the agent) and no capabilities (even root cannot remount
# / read-write). The network stays on: installing packages and fetching docs need it.

WALL = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--unshare-pid", "--die-with-parent", "--cap-drop", "ALL"]


def wall_problem() -> str | None:
    """Why commands run without the wall, or None when it is up. SANDBOX=off turns it off."""
    return "SANDBOX=off" if os.environ.get("SANDBOX", "").lower() == "off" else bwrap_problem()


@functools.cache
def bwrap_problem() -> str | None:
    """Try bubblewrap once: is it installed, and can it start here (not on macOS, nor in every container)?"""
    try:
        probe = subprocess.run([*WALL, "--", "true"], capture_output=True, timeout=10, check=False)
    except OSError as error:
        return f"bubblewrap cannot start: {error.strerror}"
    return f"bubblewrap cannot start: {probe.stderr.decode(errors='replace').strip()}" if probe.returncode else None


def walled(argv: list) -> list:
    """argv run inside the wall when it is up. WORKDIR is bound after the private /tmp, which may hold it."""
    workspace = str(WORKDIR.resolve())
    return argv if wall_problem() else [*WALL, "--bind", workspace, workspace, "--chdir", workspace, "--", *argv]


# -- fence 4: a bash tool that cannot be wedged ------------------------------------

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def command_env() -> dict:
    """The agent's environment without its secrets: the command needs none of them."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("ANTHROPIC_") and not any(word in name.upper() for word in SECRET_WORDS)}


def read_output(process) -> tuple:
    """Read the command's output until it ends, passes MAX_OUTPUT, or time runs out: (bytes, why it was
    stopped, or None). The shell's exit ends the read even if a background child still holds the pipe open."""
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
    """Run a checked command with bash in WORKDIR, inside the wall when it is up; return its output."""
    reason = check_command(command)
    if reason:
        raise PermissionError(f"refused, not run: {reason}. Find a safer way, or ask the user to run it")
    process = subprocess.Popen(
        walled(["bash", "-c", command]), cwd=WORKDIR, env=command_env(), stdin=subprocess.DEVNULL,
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


def count(number: int, thing: str) -> str:
    """A number and its noun: "1 line", "2 lines"."""
    return f"{number:,} {thing}" if number == 1 else f"{number:,} {thing}s"


def shorten(line: str, width: int = 120) -> str:
    """A line cut to `width` characters, ending with … when something was cut."""
    return line if len(line) <= width else line[:width - 1] + "…"


def show_tool_call(block, indent: str = "") -> None:
    arguments = block.input if isinstance(block.input, dict) else {"input": block.input}  # shown before it is checked
    args = " ".join(str(value) for value in arguments.values()).replace("\n", " ")
    label = str(arguments.get("description") or "")  # any type may come: the arguments are not checked yet
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


def run_tool(block, tools: list, indent: str = "") -> dict:
    """Run one tool call, showing the call and a glimpse of its result."""
    global running_call_id
    running_call_id = block.id  # for run_task: see running_call_id
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


def call_model(messages: list, tools: list, system: str, agent: str = "parent", task=None):
    """The one place the API is called; the reply's text is printed as it arrives. Each call is
    recorded in the transcript, also one that fails or is cut short (Ctrl-C, a signal)."""
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
    if reason is None:  # the stream ended before the server said why the reply stopped
        raise TurnFailed("the reply stopped midway (the server closed the stream); "
                         "check ANTHROPIC_BASE_URL")
    # The API rejects an empty text block sent back to it (some compatible servers write them),
    # and an empty assistant message would make every later request invalid.
    content = [block for block in response.content if block.type != "text" or block.text]
    if not content:
        print(dim(f"{indent}(the model sent an empty reply)"))
        content = [{"type": "text", "text": "(empty reply)"}]
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


def run_turn(messages: list, user_text: str) -> None:
    """One turn of the conversation. On any failure, drop the turn so the history stays valid."""
    global turn_number
    turn_number += 1  # the transcript says which turn each call belongs to
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - nothing that goes wrong in a turn ends the session
        del messages[start:]
        print(f"\n{describe_error(error)}. This turn was dropped from the conversation "
              "(files it changed stay changed).")


# -- the subagent ----------------------------------------------------------------

# The id of the tool call being run. A tool's handler gets only the arguments the model wrote, so
# run_tool keeps the id here; run_task passes it to run_subagent, and each transcript line of the
# child names the task that started it ("task"), so two tasks of one turn are told apart.
running_call_id = None


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


TOOL_HANDLERS["task"] = run_task  # a handler for the parent's extra tool; the child is never offered it


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


def main() -> int:
    global client, API_TIMEOUT, API_RETRIES, MAX_TOKENS, MAX_MODEL_CALLS
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show is printed as "?"
    load_dotenv()
    API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
    API_RETRIES = number_setting("API_RETRIES", API_RETRIES)
    MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
    MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
    if endpoint() is None:
        print(f"ANTHROPIC_BASE_URL={base_url()!r} is not a URL: write it as http://host:port "
              "or https://host", file=sys.stderr)
        return 2
    client = make_client()
    if client is None:
        print(MISSING_KEY.format(stage=STAGE), file=sys.stderr)
        return 2
    problem = wall_problem()
    print(dim(f"the wall is off ({problem}): only the filter stands in front of commands" if problem
              else "the wall is on: commands see the file system read-only, except this workspace"))
    save_transcript(None)  # can it be written? If not, it says so now and recording is off
    transcript = os.environ.get("TRANSCRIPT")  # still set only if it can be written
    recording = f", recording each call in {transcript}" if transcript else ""
    print(dim(f"model {os.environ.get('MODEL_ID') or DEFAULT_MODEL} at {endpoint()}{recording}"))
    # `timeout` or a closed terminal: leave through every `finally`: a call cut short is recorded.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, frame: sys.exit(128 + number))
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # noqa: F401 - loading it gives input() line editing, and Up recalls earlier lines
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
