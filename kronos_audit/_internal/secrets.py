"""Secrets kaudit must never print, commit or sign: credentials in URLs, secret files.

A manifest is signed and kept for ever, ``.kaudit/patches/`` and ``.dvc/config`` are
committed with it, and terminal output ends up in CI logs. So a password or token in a
remote URL is split off before the URL goes anywhere public (:func:`split_credentials`),
and a file that looks like a secret is named before its content goes into a recorded
patch (:func:`secret_file_reason`).
"""

from __future__ import annotations

import fnmatch
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

REDACTED = "***"

# Schemes whose user name is usually a token (GitHub, GitLab, Bitbucket and most HTTP
# services take `https://TOKEN@host/` or `https://oauth2:TOKEN@host/`): the whole
# userinfo is a credential there, not only the password.
_HTTP_LIKE = frozenset({"http", "https", "webdav", "webdavs", "ftp", "ftps"})

# Well-known token formats, so a token is recognised wherever it sits in a URL.
_TOKEN_PREFIX = re.compile(
    r"^(gh[pousr]_|github_pat_|glpat-|glptt-|gldt-|xox[abprs]-|AKIA|ASIA|sk-|hf_|npm_|pypi-)"
)
# What a login name looks like (POSIX portable user names, at most 32 characters).
# Tokens are longer or carry characters that names do not.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")

# A URL inside a longer text (an option's value, a line of a file): from its scheme to a
# space, a quote or the next URL's scheme (`a=https://u:p@h/x,https://v:q@h2/y` is two).
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
_URL_IN_TEXT = re.compile(_SCHEME + r"(?:(?!" + _SCHEME + r")[^\s\"'<>`])+")

# Query-string (or fragment) parameter names that carry a credential: `token`,
# `access_token`, `private_token`, `X-Amz-Signature`, `X-Amz-Credential`,
# `X-Amz-Security-Token`, Azure SAS `sig`, `key`, `api_key`, `secret`, `password` ...
_SECRET_PARAM_WORDS = ("token", "secret", "passw", "signature", "credential", "apikey")
_SECRET_PARAM_NAMES = frozenset({"key", "sig", "pass", "pwd", "pw", "auth", "code", "session"})


def is_secret_param(name: str) -> bool:
    """Whether a URL parameter named ``name`` (case and ``-``/``_`` ignored) holds a
    credential. Errs on the side of yes: a parameter wrongly taken for one only moves to
    the local, uncommitted configuration."""
    n = name.lower().replace("-", "_")
    return (
        n in _SECRET_PARAM_NAMES
        or any(w in n for w in _SECRET_PARAM_WORDS)
        or n.endswith(("key", "_sig", "_auth"))
        or bool(_TOKEN_PREFIX.match(name))
    )


def _is_token_user(user: str) -> bool:
    return bool(_TOKEN_PREFIX.match(user)) or not _USER_NAME.fullmatch(user)


@dataclass(frozen=True)
class SplitURL:
    """A URL taken apart into what may be published and what must stay private."""

    url: str
    """The URL as given, credentials included: only for the uncommitted local config."""
    public: str
    """The URL without any credential: for ``.dvc/config``, manifests and logs."""
    shown: str
    """The URL with each credential replaced by ``***``: what is printed."""
    scheme: str
    """Lower-case scheme, ``""`` for a path or scp-like ``host:path``."""
    user: str | None
    """A user name removed from the URL (decoded), or None when none was removed."""
    password: str | None
    """The password removed from the URL (decoded), or None when there was none."""
    secret_params: bool
    """The query string or fragment carried a credential (removed from ``public``)."""
    secrets: tuple[str, ...]
    """Every secret string removed, as written and decoded: to scrub from messages."""

    @property
    def has_secret(self) -> bool:
        """Something had to be removed to make the URL public."""
        return self.public != self.url

    def scrub(self, text: str) -> str:
        """``text`` (an error message from a library given the URL) with every secret of
        this URL replaced by ``***``."""
        if self.has_secret:
            text = text.replace(self.url, self.shown)
        for s in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(s, REDACTED)
        return text


def _filter_params(text: str, sep: str) -> tuple[str, str, list[str]]:
    """``text`` (a query or fragment) without, and with masked, its secret parameters."""
    kept: list[str] = []
    shown: list[str] = []
    secrets: list[str] = []
    for piece in text.split(sep):
        name, eq, value = piece.partition("=")
        decoded = urllib.parse.unquote_plus(name)
        if eq and is_secret_param(decoded):
            shown.append(f"{name}={REDACTED}")
            if value:
                secrets.extend({value, urllib.parse.unquote_plus(value)})
        elif not eq and _TOKEN_PREFIX.match(decoded):  # `?ghp_...`: the token itself
            shown.append(REDACTED)
            secrets.extend({name, decoded})
        else:
            kept.append(piece)
            shown.append(piece)
    return sep.join(kept), sep.join(shown), secrets


def _split_scp_like(url: str) -> SplitURL:
    # `[user@]host:path` (git's scp-like syntax) or a plain path: only a `user:password@`
    # or a token in place of the user before the first `/` is a credential.
    userinfo, at, rest = url.partition("@")
    if not at or "/" in userinfo or not userinfo:
        return SplitURL(url, url, url, "", None, None, False, ())
    user, colon, password = userinfo.partition(":")
    if colon:
        return SplitURL(
            url, f"{user}@{rest}", f"{user}:{REDACTED}@{rest}", "", None, password, False,
            (password,) if password else (),
        )  # fmt: skip
    if _is_token_user(user):
        return SplitURL(url, rest, f"{REDACTED}@{rest}", "", user, None, False, (user,))
    return SplitURL(url, url, url, "", None, None, False, ())


def split_credentials(url: str) -> SplitURL:
    """Take the credentials out of ``url``: a password in the userinfo (any scheme), the
    whole userinfo for http-like schemes or when the user name is a token, and query or
    fragment parameters named like credentials. Everything else is kept byte for byte."""
    if "://" not in url:
        return _split_scp_like(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        # Unparseable (say, a broken IPv6 host): nothing of it can be shown safely.
        head = url.split("://", 1)[0]
        public = f"{head}://{REDACTED}"
        return SplitURL(url, public, public, head.lower(), None, None, False, (url,))
    scheme = parts.scheme.lower()
    base_scheme = scheme.rsplit("+", 1)[-1]  # git+https, svn+ssh ...
    secrets: list[str] = []
    user: str | None = None
    password: str | None = None
    netloc = shown_netloc = parts.netloc
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        raw_user, colon, raw_password = userinfo.partition(":")
        decoded_user = urllib.parse.unquote(raw_user)
        drop_user = base_scheme in _HTTP_LIKE or _is_token_user(decoded_user)
        if colon:
            password = urllib.parse.unquote(raw_password)
            if raw_password:
                secrets.extend({raw_password, password})
        if drop_user and raw_user:
            user = decoded_user
            secrets.extend({raw_user, decoded_user})
        kept_user = "" if drop_user else raw_user
        netloc = f"{kept_user}@{host}" if kept_user else host
        shown_userinfo = REDACTED if drop_user and raw_user else raw_user
        if colon:
            shown_userinfo += f":{REDACTED}"
        shown_netloc = f"{shown_userinfo}@{host}" if shown_userinfo else host
    query, shown_query, query_secrets = _filter_params(parts.query, "&")
    fragment, shown_fragment = parts.fragment, parts.fragment
    fragment_secrets: list[str] = []
    if "=" in parts.fragment or _TOKEN_PREFIX.match(parts.fragment):
        fragment, shown_fragment, fragment_secrets = _filter_params(parts.fragment, "&")
    secrets += query_secrets + fragment_secrets
    if netloc == parts.netloc and not secrets:
        return SplitURL(url, url, url, scheme, None, None, False, ())
    public = urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))
    shown = urllib.parse.urlunsplit(
        parts._replace(netloc=shown_netloc, query=shown_query, fragment=shown_fragment)
    )
    return SplitURL(
        url,
        public,
        shown,
        scheme,
        user,
        password,
        bool(query != parts.query or fragment != parts.fragment),
        tuple(dict.fromkeys(s for s in secrets if s)),
    )


def strip_credentials(url: str) -> str:
    """``url`` without any credential (see :func:`split_credentials`)."""
    return split_credentials(url).public


def redact(url: str) -> str:
    """``url`` with each credential replaced by ``***``, for printing."""
    return split_credentials(url).shown


# File names that hold secrets by convention. Matched against the base name, ignoring
# case (the same file on a case-insensitive file system).
SECRET_FILE_PATTERNS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.ppk",
    "*.jks",
    "*.keystore",
    "credentials*.json",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
)
# Templates meant to be committed: they document the variables, not their values.
_SECRET_FILE_TEMPLATES = (".env.example", ".env.sample", ".env.template", ".env.dist")
# ssh-keygen's default names (id_rsa, id_ed25519_sk, id_ecdsa-work ...) and any other
# `id_NAME` without an extension; `.pub` is the public half.
_SSH_PRIVATE_KEY = re.compile(
    r"id_(rsa|dsa|ecdsa|ed25519|xmss)(_sk)?([._-].*)?|id_[^.]+", re.IGNORECASE
)


def secret_file_reason(path: str) -> str | None:
    """Why a file at ``path`` (a repository-relative name) looks like a secret, or None."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    if name in _SECRET_FILE_TEMPLATES:
        return None
    if _SSH_PRIVATE_KEY.fullmatch(name) and not name.endswith(".pub"):
        return "an ssh private key name"
    for pattern in SECRET_FILE_PATTERNS:
        if fnmatch.fnmatchcase(name, pattern):
            return f"named like {pattern}"
    return None


# Words of an option's name (split at `-`, `_` and `.`) that say its value is a credential,
# as `--api-key`, `--token`, `--db-password`, `model.secret_key=` do; a word such as
# `tokenizer` or `keep` is not one of them.
_SECRET_OPTION_WORDS = frozenset(
    {
        "token", "secret", "password", "passwd", "pass", "pwd", "key", "apikey",
        "credential", "credentials", "auth", "authtoken", "accesstoken", "passphrase",
    }
)  # fmt: skip


def _secret_option(name: str) -> bool:
    words = re.split(r"[-_.]+", name.lower().lstrip("-"))
    return any(w in _SECRET_OPTION_WORDS for w in words if w)


def _scrub_urls_in(text: str) -> str:
    """``text`` with each URL in it, wherever it sits (``--data=https://bob:pw@host/set``,
    ``a,https://...``), shown without its credentials, as a git remote is."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda u: split_credentials(u.group(0)).shown, text)


def scrub_urls(argv: Sequence[str]) -> ScrubbedCommand:
    """``argv`` with only the credentials of the URLs in its arguments replaced by ``***``
    (a userinfo password or token, credential-named query parameters): what every
    recorded command gets, a command a program declares included, since no replay is
    worth a password signed into a manifest for ever."""
    out = [_scrub_urls_in(str(a)) for a in argv]
    said = [f"argument {i} (a URL's credentials)" for i, a in enumerate(argv) if out[i] != a]
    return ScrubbedCommand(tuple(out), tuple(said))


@dataclass(frozen=True)
class ScrubbedCommand:
    """A command line with its credential-looking arguments replaced by ``***``."""

    argv: tuple[str, ...]
    """What may be recorded (signed, committed, copied to remotes)."""
    scrubbed: tuple[str, ...]
    """What was replaced, described without the secret (``--api-key``, ``argument 3 (a
    URL's credentials)``): to say so."""


def scrub_command(argv: list[str] | tuple[str, ...]) -> ScrubbedCommand:
    """``argv`` without credentials, by the rules git remotes get (:func:`split_credentials`)
    and option names: a URL's userinfo password or token and secret query parameters,
    wherever the URL sits in an argument (``--data=https://bob:pw@host/set``); the
    value of an option whose name says token, key, secret or password (``--api-key=V``,
    ``--token V``, ``db.password=V``); an argument that is a well-known token (``ghp_...``).
    Everything else is kept as it is."""
    out: list[str] = []
    said: list[str] = []
    value_next: str | None = None
    for i, arg in enumerate(argv):
        if value_next is not None and not arg.startswith("-"):
            out.append(REDACTED)
            said.append(value_next)
            value_next = None
            continue
        value_next = None
        name, eq, value = arg.partition("=")
        if eq and value and _secret_option(name) and (name.startswith("-") or "/" not in name):
            out.append(f"{name}={REDACTED}")
            said.append(name)
        elif arg.startswith("-") and not eq and _secret_option(arg):
            out.append(arg)
            value_next = arg  # `--token VALUE`: the value is the next argument
        elif _TOKEN_PREFIX.match(arg) and " " not in arg and len(arg) >= 16:
            out.append(REDACTED)
            said.append(f"argument {i} (a token)")
        elif "://" in arg:
            shown = _scrub_urls_in(arg)
            out.append(shown)
            if shown != arg:
                said.append(f"argument {i} (a URL's credentials)")
        elif "@" in arg:
            split = split_credentials(arg)
            if split.has_secret:
                out.append(split.shown)
                said.append(f"argument {i} (a URL's credentials)")
            else:
                out.append(arg)
        else:
            out.append(arg)
    return ScrubbedCommand(tuple(out), tuple(said))


# -- secrets in the content of a recorded patch ------------------------------------------

# Tokens whose format says what they are, wherever they sit in a line: GitHub, GitLab,
# Slack, AWS access key ids, Hugging Face, npm, PyPI, Google API keys, Stripe live keys.
_TOKEN_IN_TEXT = re.compile(
    r"(?<![A-Za-z0-9_])("
    r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}|"
    r"gl(?:pat|ptt|dt)-[A-Za-z0-9_-]{20,}|xox[abeprs]-[A-Za-z0-9-]{10,}|"
    r"(?:AKIA|ASIA)[0-9A-Z]{16}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}|"
    r"pypi-AgE[A-Za-z0-9_-]{50,}|AIza[0-9A-Za-z_-]{35}|sk_live_[0-9A-Za-z]{20,}"
    r")"
)
# A private key in any of the usual armours (PEM, OpenSSH, PuTTY).
_PRIVATE_KEY_TEXT = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File-|"
    r"\"private_key\"\s*:\s*\"-----BEGIN"
)
# `NAME=value`, `export NAME=value` (a dotenv or shell line), `name = value` (an INI file,
# as ~/.aws/credentials), `NAME: value` (YAML): the name says credential, the value is
# written out (not `$VAR`, `${VAR}`, `<placeholder>`, empty, or a short word).
_ASSIGNMENT = re.compile(
    r"^\s*(?:export\s+)?[\"']?(?P<name>[A-Za-z_][A-Za-z0-9_.-]{0,63})[\"']?"
    r"\s*(?P<op>=|:)\s*(?P<value>\S.*?)\s*$"
)
_PLACEHOLDER = re.compile(r"^[\"']?(\$|<|\{\{|%\(|\*\*\*|x{3,}|\.\.\.|changeme|none|null)", re.I)
# Names that are credentials whatever their words: the cloud providers' own.
_CLOUD_NAMES = frozenset(
    {
        "aws_secret_access_key", "aws_session_token", "aws_security_token",
        "azure_client_secret", "azure_storage_key", "azure_storage_connection_string",
        "google_api_key", "gcp_service_account_key", "client_secret", "private_key",
        "private_key_id",
    }
)  # fmt: skip
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def secret_text_reason(line: str) -> str | None:
    """Why one line of text looks like it holds a secret, in words that do not repeat it,
    or None: a well-known token format, a private key's armour, a URL with a password or
    token, or an assignment (``KEY=value`` of a dotenv file, ``key = value`` of an INI
    file such as ``~/.aws/credentials``) whose name says credential and whose value is
    written out."""
    if (m := _TOKEN_IN_TEXT.search(line)) is not None:
        return f"a token ({m.group(1)[:4]}...)"
    if _PRIVATE_KEY_TEXT.search(line):
        return "a private key"
    for url in _URL_IN_TEXT.findall(line):
        split = split_credentials(url)
        if split.password or (split.user and _is_token_user(split.user)):
            return "a URL with a password or token"
    m = _ASSIGNMENT.match(line)
    if m is None:
        return None
    name, value = m.group("name"), m.group("value").strip("\"'")
    if len(value) < 8 or " " in value or _PLACEHOLDER.match(m.group("value")):
        return None
    spaced = m.group("op") == ":" or line[: m.start("op")].endswith((" ", "\t"))
    code_like = _IDENTIFIER.fullmatch(value) and not any(c.isdigit() for c in value)
    if spaced and (code_like or any(c in value for c in "()[]")):
        # `token = os.environ["T"]`, `key: str`, `password = prompt()`: code that reads
        # or types a secret, not the secret (a dotenv line has no space before its `=`).
        return None
    lowered = name.lower().replace("-", "_").replace(".", "_")
    if lowered in _CLOUD_NAMES or _secret_option(name):
        return f"a line {name}{m.group('op')}..."
    return None


@dataclass(frozen=True)
class SecretInPatch:
    """Where a patch adds what looks like a secret (the secret itself is not kept)."""

    path: str
    """The repository-relative name of the file the line is added to."""
    line: int
    """The line's number in that file, as the patch adds it."""
    reason: str
    """What it looks like (:func:`secret_text_reason`)."""


def secret_in_patch(patch: bytes) -> SecretInPatch | None:
    """The first line a git patch (``git diff``) adds that looks like a secret, or None.

    Only added lines of text hunks are read (a deleted secret is published by nothing
    new; a binary patch's base85 is not text), whatever the file is called: a secret
    copied into ``.gitignore`` is refused as surely as one in ``.env``."""
    path = "?"
    number = 0
    in_hunk = False
    for raw in patch.split(b"\n"):
        if raw.startswith(b"diff --git "):
            in_hunk = False
            continue
        if not in_hunk and raw.startswith(b"+++ "):
            target = raw[4:].decode("utf-8", "replace")
            path = target[2:] if target.startswith("b/") else target
            continue
        if raw.startswith(b"@@ "):
            in_hunk = True
            m = re.match(rb"@@ -\d+(?:,\d+)? \+(\d+)", raw)
            number = int(m.group(1)) if m else 0
            continue
        if not in_hunk:
            continue
        if raw.startswith(b"+"):
            reason = secret_text_reason(raw[1:].decode("utf-8", "replace"))
            if reason is not None:
                return SecretInPatch(path, number, reason)
            number += 1
        elif raw.startswith(b" "):
            number += 1
    return None
