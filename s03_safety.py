#!/usr/bin/env python3
"""s03_safety.py - fences around the tools.

    tool_use --> file tools --> safe_path(path) ---- outside WORKDIR? --> refused
             |                  check_door(file) --- runs later, or a .env? --> refused
             +-> bash ------> check_command(cmd) -- dangerous? --> refused with a reason, not run
                                   |
                              run_bash: bash inside the wall (bubblewrap), which decides what it
                              can change, read and reach; limits on time, output and processes

Key insight: a model with a shell and a file system needs fences, and the real boundary is the
operating system: the wall decides what a command can touch, read and reach. The command filter
is a speed bump that explains: it refuses the usual dangerous commands with a reason the model
can act on.

Map: THE LESSON: the fences, new here: the wall (walled, check_door), paths (safe_path), the
filter (check_command), bash's limits (run_bash); then s02's tools and s01's loop; THE
MACHINERY, to skip on a first reading: the screen, the wire, start-up (wall_state, main).
"""

import sys

# The wall leaves the workspace writable, and Python imports from a script's own folder first:
# started in its own folder, the stage drops it, so that a module planted there (a dotenv.py,
# say) cannot run at the next start, outside the wall.
if __name__ == "__main__" and not sys.flags.safe_path:
    del sys.path[0]

import contextlib
import functools
import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
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
PROMPT = f"{STAGE} >> "
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
# -- new in s03: the fences ------------------------------------------------------------------
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
    from dotenv import find_dotenv
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


# -- from s02: file tools, each a plain function that the model calls by name ---------------------

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
    check_kind(folder, path, "a folder")
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return cap("\n".join(entries)) or "(empty folder)"

def check_args(schema: dict, args: dict) -> str | None:
    """What is wrong with the model's arguments for a tool, or None if they fit its schema."""
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        wanted = schema["properties"].get(name, {}).get("type")
        if wanted is None:
            return f"unexpected argument {name!r}; it takes {', '.join(schema['properties'])}"
        if not isinstance(value, JSON_TYPES[wanted]) or isinstance(value, bool):  # True is an int
            return f"argument {name!r} must be of type {wanted}, not {type(value).__name__}"
    return None

JSON_TYPES = {"string": str, "integer": int}
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
            if target.exists():  # keep its permission bits: a script stays executable
                os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a crash cannot leave it empty
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise

# -- from s01: the loop, and its tools dispatched by name ------------------------------------------

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
    with recorded(request) as call:  # in the transcript, whatever happens
        call["response"] = stream_reply(request)
    show_usage(call["response"].usage)
    return call["response"]

TURN_ENDERS = {  # stop reasons after which the turn cannot go on
    "refusal": "the model declined this request (refusal); rephrase it and try again",
    "model_context_window_exceeded": "the conversation outgrew the context window; start anew",
    None: "the reply stopped midway (the server closed the stream); check ANTHROPIC_BASE_URL",
}

def take_reply(messages: list, response) -> str | None:
    """Add the reply to the history; return its final text, or None to call the model again."""
    stop = response.stop_reason
    if stop in TURN_ENDERS:
        raise TurnFailed(TURN_ENDERS[stop])
    add_reply(messages, response.content)
    calls = [block for block in response.content if block.type == "tool_use"]
    if stop == "max_tokens":
        print(dim("(the reply was cut off at max_tokens)"))
    if stop == "max_tokens" and calls:  # a cut-off call may have lost arguments: never run it
        cut = "error: not run: your reply was cut off at max_tokens. Try a shorter call."
        messages.append({"role": "user", "content": [tool_result(b, cut, True) for b in calls]})
        return None
    if stop == "tool_use" and calls:
        messages.append({"role": "user", "content": [run_tool(block) for block in calls]})
        return None
    if stop == "pause_turn":
        return None  # the API paused a long turn: sending the history back resumes it
    return text_of(response.content)

def run_turn(messages: list, user_text: str) -> None:
    """One turn. If it fails, it leaves the history (which so stays valid); the session goes on."""
    global turn_number
    turn_number += 1  # the transcript says which turn each call belongs to
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001
        del messages[start:]
        print(f"\n{describe_error(error)}. The turn was dropped; files it changed stay changed.")

def add_reply(messages: list, content: list) -> None:
    """Without empty text blocks (the API rejects them), and not at all if empty."""
    content = [block for block in content if block.type != "text" or block.text]
    if content:
        messages.append({"role": "assistant", "content": content})
    else:
        print(dim("(the model sent an empty reply)"))

def system_prompt() -> str:
    network = "on" if network_on() else "off; if a task needs it, ask the user to set NETWORK=on"
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly. Commands run in a sandbox, where "
        f"the network is {network}."
    )

class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""

def run_tool(block) -> dict:
    show_tool_call(block)
    result = dispatch(block)
    show_tool_result(result)
    return result

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

def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text),
            "is_error": is_error}

def cap(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"

# == THE MACHINERY: the screen, the wire, start-up. Safe to skip on a first reading. =============

def dim(text: str) -> str:
    """Grey on a terminal; plain in a pipe or a file, or when NO_COLOR is set."""
    grey = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return f"\033[2m{text}\033[0m" if grey else text

def printable(text: str) -> str:
    """Control characters escaped: an escape sequence could set the terminal's title, say."""
    return re.sub("[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda char: repr(char[0])[1:-1], text)

def shorten(line: str, width: int = 120) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"

def show_tool_call(block) -> None:
    arguments = block.input.values() if isinstance(block.input, dict) else [block.input]
    print(dim(printable(f"> {block.name}: {shorten(' '.join(map(str, arguments)))}")))

def show_tool_result(result: dict) -> None:
    """A glimpse (the model gets all of it): the first line; after a failure, the last lines."""
    lines = [line for line in result["content"].splitlines() if line.strip()] or [""]
    failed = result["is_error"] or lines[-1].startswith("(exit code")
    for line in lines[-3:] if failed else lines[:1]:
        print(dim(printable(f"  {shorten(line)}")))
    if len(lines) > 1:
        print(dim(f"  ({len(lines)} lines in all)"))

def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what it read from or wrote to the cache."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached

def show_usage(usage) -> None:
    print(dim(f"[context {context_tokens(usage):,} tokens, {usage.cache_read_input_tokens or 0:,}"
              f" read from cache; output {usage.output_tokens:,}]"))

def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")

def valid_utf8(text: str) -> str:
    """Python keeps bytes that are not UTF-8 as lone surrogates, which the API cannot take."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)

def stream_reply(request: dict):
    """Send the request with the SDK's stream helper; print the text as it comes; return it all."""
    import anthropic  # loaded by make_client already
    try:
        with client.messages.stream(**request) as stream:
            for text in stream.text_stream:
                print(printable(text), end="", flush=True)
            reply = stream.get_final_message()
    except anthropic.APIError:
        raise
    # Mid-stream the SDK wraps no error: a timeout, a tool call's broken JSON, a body with no events
    except Exception as error:  # noqa: BLE001
        raise TurnFailed(f"the reply broke off ({shorten(str(error) or type(error).__name__, 100)})"
                         "; check ANTHROPIC_BASE_URL and MODEL_ID, or raise API_TIMEOUT for a slow "
                         "server") from None
    if text_of(reply.content):
        print()  # end the line the text streamed onto
    return reply

SESSION = os.urandom(4).hex()  # each transcript line names its run of the stage...
turn_number = 0  # ...and your turn, counted by run_turn

@contextlib.contextmanager
def recorded(request: dict, **fields):
    """Record a model call in TRANSCRIPT, also one that fails or is cut short (Ctrl-C, a signal)."""
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": None,
            "session": SESSION, "turn": turn_number, "agent": "parent", **fields,
            "request": request, "response": None}
    started = time.monotonic()
    try:
        yield line
    except BaseException as error:
        line["error"] = describe_error(error)
        raise
    finally:
        line["seconds"] = round(time.monotonic() - started, 3)
        save_transcript(line)

def save_transcript(line: dict | None) -> None:
    """Append a line to TRANSCRIPT, if set (never the key); if it cannot, say so and stop."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as file:
            if line is not None:  # main() writes None to try the file
                file.write(json.dumps(line, default=lambda sdk_object: sdk_object.model_dump(
                    mode="json", exclude_none=True)) + "\n")
    except OSError as error:
        del os.environ["TRANSCRIPT"]
        print(f"cannot write TRANSCRIPT={path} ({error.strerror or error}); recording is off")

def describe_error(error: BaseException) -> str:
    """What ended a turn (or a model call), in one line naming the setting to check."""
    import anthropic  # loaded by make_client already
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, anthropic.APIConnectionError):  # the error it chains says why
        return (f"API error: cannot reach {error.request.url} ({error.__cause__ or error}); "
                "check ANTHROPIC_BASE_URL, or raise API_TIMEOUT for a slow server")
    if isinstance(error, anthropic.APIStatusError):
        text = f"API error {error.status_code} ({server_said(error)}), request {error.request_id}"
        if error.status_code in (400, 401, 403, 404):  # from a proxy too: a wrong setting
            text += "; check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID"
        return text
    return str(error) if isinstance(error, TurnFailed) else f"{type(error).__name__}: {error}"

def server_said(error) -> str:
    """The type and message of an error body (the oldest SDK allowed has no fields for them)."""
    details = error.body.get("error") if isinstance(error.body, dict) else None
    if isinstance(details, dict):
        return f"{details.get('type')}: {details.get('message')}"
    return shorten(error.response.text.strip(), 200) or "no message"

MISSING_KEY = """\
No API key: set ANTHROPIC_API_KEY, in the environment or in .env beside this script (copy
.env.example to .env). For a compatible provider set ANTHROPIC_BASE_URL too; MODEL_ID picks the
model. No key at all? `python tests/demo.py {stage}` runs this stage with a scripted model."""

def make_client():
    """The API client, or None without a key. (Imported here, the SDK delays no message.)"""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return None
    import anthropic
    hooks = {"request": [show_retry]}  # the HTTP client calls it before every try
    return anthropic.Anthropic(base_url=base_url(), timeout=API_TIMEOUT, max_retries=API_RETRIES,
                               http_client=anthropic.DefaultHttpxClient(event_hooks=hooks))

def show_retry(request) -> None:
    """The SDK retries by itself, silently, and numbers its tries in a header: say each retry."""
    retry = request.headers.get("x-stainless-retry-count", "0")
    if retry != "0":
        print(dim(f"(the last try failed; trying again, {retry} of {API_RETRIES})"), flush=True)

def base_url() -> str:  # empty means unset (as in a copied .env.example); not so to the SDK
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"

def number_setting(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if value and not value.isdecimal():
        print(f"{name}={value!r} is not a whole number; using {default}")
    return int(value) if value.isdecimal() else default

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
    from dotenv import load_dotenv  # here: a missing package is said plainly (see the end)
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show prints as "?"
    load_dotenv()
    API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
    API_RETRIES = number_setting("API_RETRIES", API_RETRIES)
    MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
    MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
    if not re.fullmatch(r"https?://[^/:]+(:[0-9]+)?(/.*)?", base_url()):  # http(s)://host:port
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
    print(dim(f"model {os.environ.get('MODEL_ID') or DEFAULT_MODEL} at {base_url().rstrip('/')}"))
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # input() gets line editing; Up recalls earlier lines
    messages, warned = [], False
    while True:
        try:
            user_text = input(PROMPT)
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            readline = sys.modules.get("readline")  # it holds what was typed
            if readline and readline.get_line_buffer():  # as in bash: Ctrl-C throws the line away
                warned = False
            elif warned:
                return 0
            else:  # on an empty line it asks once before leaving
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
    except ModuleNotFoundError as missing:  # started outside the virtual environment
        sys.exit(f"{missing.name} is not installed for {sys.executable}: activate the virtual "
                 "environment (. .venv/bin/activate), or pip install -r requirements.txt")
