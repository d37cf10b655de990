"""Request → Program identity and request hints (upstream ``identity.rs``, spec §3.1).

Theory of operation: a request opts into Program scheduling only through the configured enable key. Under
the default key (``vllm_xargs.agentic_context``) only the canonical body context does; under ``auto`` the
sources are tried in strict precedence — canonical context, then ``agent_hint``, then exactly one framework
header schema (Claude Code, Codex/OpenCode, generic ``x-session-id``) — and never mixed. Anything recognised
but malformed is an ``InvalidIdentity`` (HTTP 400) carrying upstream's reason; anything unrecognised is
``None`` (native path).

Beyond the spec, and only with ``identity_extensions`` (under ``auto``): when none of the spec's sources is
present, what the harnesses really send names the session — Claude Code's ``metadata.user_id`` (a JSON
string with ``session_id``, or the older ``user_<hash>_account_<uuid>_session_<uuid>``), OpenCode's
``x-opencode-session`` header, Codex CLI's ``session_id`` header (with ``x-openai-subagent``). Each derives
an identity exactly as a spec header schema does; the spec's own sources always win.

Rules that fence this module in: it is sans-I/O and stateless (it only remembers what a context string derives
to, a pure function of the string). ``step_id`` is returned as sent (``None`` when omitted); numbering
omitted steps needs per-Program memory and belongs to the scheduler.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from progrouter.config import EnableKey
from progrouter.program import InvalidIdentity, ProgramIdentity, RequestHints
from progrouter.routing.hash_key import answers_any_case, is_mapping, native_hash_key

MAX_IDENTITY_COMPONENT_BYTES = 256
MAX_PLACEMENT_HASH_KEY_BYTES = 512
MAX_AGENTIC_CONTEXT_BYTES = 16 * 1024
# Derivations remembered per context string (at most this many strings of at most this many characters:
# a bounded memory, ~4 MiB at worst); a longer context is derived afresh each time.
REMEMBERED_CONTEXTS = 4096
MAX_REMEMBERED_CONTEXT_CHARS = 512

CLAUDE_SESSION_HEADER = "x-claude-code-session-id"
CLAUDE_AGENT_HEADER = "x-claude-code-agent-id"
CLAUDE_PARENT_AGENT_HEADER = "x-claude-code-parent-agent-id"
CODEX_SESSION_HEADER = "session-id"
CODEX_THREAD_HEADER = "thread-id"
GENERIC_SESSION_HEADER = "x-session-id"
# Beyond the spec (``identity_extensions``): the headers the harnesses send themselves.
OPENCODE_SESSION_HEADER = "x-opencode-session"
CODEX_CLI_SESSION_HEADER = "session_id"
CODEX_CLI_SUBAGENT_HEADER = "x-openai-subagent"
SOURCE_CLAUDE_METADATA = "metadata:claude_code"
_LEGACY_USER_ID_SESSION = "_session_"

SOURCE_AGENTIC_CONTEXT = "agentic_context"
SOURCE_AGENT_HINT = "agent_hint"


@dataclass(frozen=True, slots=True)
class _HeaderSchema:
    name: str
    session: str
    agent: str | None
    parent: str | None


# Strict precedence: the first schema whose session header is present wins; schemas are never mixed.
HEADER_SCHEMAS: tuple[_HeaderSchema, ...] = (
    _HeaderSchema("claude_code", CLAUDE_SESSION_HEADER, CLAUDE_AGENT_HEADER, CLAUDE_PARENT_AGENT_HEADER),
    _HeaderSchema("codex", CODEX_SESSION_HEADER, CODEX_THREAD_HEADER, None),
    _HeaderSchema("generic", GENERIC_SESSION_HEADER, None, None),
)
# Beyond the spec, tried in this order after the spec's sources (``identity_extensions``).
EXTENSION_SCHEMAS: tuple[_HeaderSchema, ...] = (
    _HeaderSchema("opencode", OPENCODE_SESSION_HEADER, None, None),
    _HeaderSchema("codex_cli", CODEX_CLI_SESSION_HEADER, CODEX_CLI_SUBAGENT_HEADER, None),
)
_SCHEMA_HEADERS = frozenset(
    name
    for s in HEADER_SCHEMAS + EXTENSION_SCHEMAS
    for name in (s.session, s.agent, s.parent)
    if name is not None
)
# Session headers that make the placement hash key agree with native consistent-hash routing.
_PLACEMENT_SESSION_HEADERS = (CLAUDE_SESSION_HEADER, CODEX_SESSION_HEADER, GENERIC_SESSION_HEADER)

_I64_MIN, _I64_MAX, _U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class IdentityResult(NamedTuple):
    """What a request told us: who it belongs to, its request-scoped hints, and which input said so."""

    identity: ProgramIdentity
    hints: RequestHints
    # agentic_context | agent_hint | header:claude_code | header:codex | header:generic; beyond the spec
    # (identity_extensions): metadata:claude_code | header:opencode | header:codex_cli
    source: str


class _FrameworkHeaders(NamedTuple):  # a NamedTuple: hashed in C as a key of the remembered derivations
    schema: str | None = None
    session: str | None = None
    agent: str | None = None
    parent_agent: str | None = None


class _Base(NamedTuple):
    """Who a canonical context names: the identity's fields up to its hash key, and the first of their
    bounds that is exceeded (reported after the fields read later, as upstream orders its checks)."""

    program_id: str
    placement_key: str
    task_id: str | None
    session_id: str | None
    agent_id: str | None
    agent_role: str | None
    parent_program_id: str | None
    root_program_id: str | None
    blocks_parent: bool
    expected_resume: bool
    late_bounds_error: str | None


class _Tail(NamedTuple):
    """The fields a canonical context has read after the hash key, and the first exceeded bound of
    theirs (reported after the base's)."""

    spawn_reason: str | None
    step_id: int | None
    hints: RequestHints
    late_bounds_error: str | None


_NO_FRAMEWORK = _FrameworkHeaders()


def extract_identity(
    body: Mapping[str, Any] | None,
    headers: Mapping[str, str],
    enable_key: EnableKey | str,
    *,
    raw_body: bytes | None = None,
    model_pool: str | None = None,
    extensions: bool = False,
    digest_body: bool = True,
) -> IdentityResult | None:
    """Resolve the request's Program identity, or None when it takes the native (identity-free) path.

    ``raw_body`` feeds the native hash key fallback (re-serialised from ``body`` when omitted);
    ``model_pool`` is only bounds-checked here, as upstream persists it with the identity; ``extensions``
    (under ``auto`` only) adds the harness sources beyond the spec after the spec's own. ``digest_body=False``
    (a binding strategy that never reads the placement hash key) leaves a long body's digest out of the key.
    Raises ``InvalidIdentity`` for a recognised but malformed identity.
    """
    if type(enable_key) is not EnableKey:
        enable_key = EnableKey(enable_key)
    request = body if is_mapping(body) else None
    canonical = _canonical_context(request)
    if canonical is None and enable_key is not EnableKey.AUTO:
        return None  # the native path, decided before any header is looked at
    lowered = _lower_headers(headers)

    def hash_key() -> str:
        """Asked once an identity is found, as it is built (so it is built once)."""
        if model_pool is not None:
            _check_bounds((("model pool", model_pool),))
        key = _placement_hash_key(headers, lowered, request, raw_body, digest_body)
        if _too_long(key, MAX_PLACEMENT_HASH_KEY_BYTES):
            raise InvalidIdentity(f"placement hash key exceeds {MAX_PLACEMENT_HASH_KEY_BYTES} bytes")
        return key

    resolved: tuple[ProgramIdentity, RequestHints] | None
    if canonical is not None:
        resolved = _canonical_identity(canonical, lowered, hash_key)
    else:
        resolved = _agent_hint_identity(request, hash_key) or _header_identity(lowered, hash_key)
        if resolved is None and extensions and enable_key is EnableKey.AUTO:
            resolved = _extension_identity(request, lowered, model_pool)
    if resolved is None:
        return None
    identity, hints = resolved
    return IdentityResult(identity, hints, identity.source)


# ----------------------------------------------------------------------------------------------- sources


def _canonical_context(request: Mapping[str, Any] | None) -> Mapping[str, Any] | str | None:
    """The ``vllm_xargs.agentic_context`` object (decoded when sent as a JSON string), or None; a string
    short enough for its derivation to be remembered is returned as it is, once known to be valid."""
    if request is None:
        return None
    xargs = request.get("vllm_xargs")
    if xargs is None:
        return None
    if not is_mapping(xargs):
        raise InvalidIdentity("vllm_xargs must be an object")
    raw = xargs.get("agentic_context")
    if raw is None:
        return None
    if isinstance(raw, str):
        # Stock vLLM accepts only scalar vllm_xargs values, so agents send the context as a JSON string.
        if len(raw) <= MAX_REMEMBERED_CONTEXT_CHARS:
            _remembered_valid(raw)
            return raw
        return _decoded_context(raw)
    if not is_mapping(raw):
        raise InvalidIdentity("vllm_xargs.agentic_context must be an object")
    return raw


@functools.lru_cache(maxsize=REMEMBERED_CONTEXTS)
def _remembered_valid(text: str) -> bool:
    """Whether ``_decoded_context`` accepts the string: it raises when not, and nothing is remembered then
    (the decoded object is not kept: the derivations below are, and decode it again when they miss)."""
    _decoded_context(text)
    return True


def _decoded_context(text: str) -> Mapping[str, Any]:
    """The object a context string encodes; ``InvalidIdentity`` when it is too long or not an object."""
    if _too_long(text, MAX_AGENTIC_CONTEXT_BYTES):
        raise InvalidIdentity("vllm_xargs.agentic_context must contain a bounded JSON object")
    try:
        context = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InvalidIdentity("vllm_xargs.agentic_context must contain a bounded JSON object") from None
    if not is_mapping(context):
        raise InvalidIdentity("vllm_xargs.agentic_context must be an object")
    return context


def _canonical_identity(
    context: Mapping[str, Any] | str, headers: Mapping[str, str], hash_key: Callable[[], str]
) -> tuple[ProgramIdentity, RequestHints] | None:
    """The identity a canonical context names. A Program sends the same context string with each request,
    so its derivation (a pure function of the string and the framework headers) is remembered."""
    framework = _framework_headers(headers)
    base = (
        _remembered_base(context, framework)
        if isinstance(context, str)
        else _canonical_base(context, framework)
    )
    if base is None:
        return None
    placement_hash_key = hash_key()  # its errors come before those of the fields below, as upstream's do
    tail = _remembered_tail(context) if isinstance(context, str) else _canonical_tail(context)
    late_bounds_error = base.late_bounds_error or tail.late_bounds_error
    if late_bounds_error is not None:
        raise InvalidIdentity(late_bounds_error)
    identity = ProgramIdentity(
        base.program_id,
        base.placement_key,
        placement_hash_key,
        base.task_id,
        base.session_id,
        base.agent_id,
        base.agent_role,
        base.parent_program_id,
        base.root_program_id,
        base.blocks_parent,
        base.expected_resume,
        tail.spawn_reason,
        tail.step_id,
        SOURCE_AGENTIC_CONTEXT,
    )
    return identity, tail.hints


@functools.lru_cache(maxsize=REMEMBERED_CONTEXTS)
def _remembered_base(text: str, framework: _FrameworkHeaders) -> _Base | None:
    """``_canonical_base`` of a context string (nothing is remembered when it raises)."""
    return _canonical_base(_decoded_context(text), framework)


@functools.lru_cache(maxsize=REMEMBERED_CONTEXTS)
def _remembered_tail(text: str) -> _Tail:
    """``_canonical_tail`` of a context string (nothing is remembered when it raises)."""
    return _canonical_tail(_decoded_context(text))


def _canonical_base(context: Mapping[str, Any], framework: _FrameworkHeaders) -> _Base | None:
    """Who the context names and how it relates to others: the identity's fields up to its hash key (None
    when it names no Program)."""
    explicit_program_id = _string(context, "program_id")
    body_task_id = _string(context, "task_id")
    session_id = _string(context, "session_id") or framework.session
    # An explicit program_id with an explicit (even null) task_id means "no task": do not borrow the session.
    if body_task_id is not None or (explicit_program_id is not None and "task_id" in context):
        task_id = body_task_id
    else:
        task_id = session_id

    agent_id = _string(context, "agent_id") or framework.agent
    if agent_id is None and task_id is not None:
        agent_id = "lead"
    agent_id = _normalized_agent(task_id, agent_id)
    agent_role = _string(context, "agent_role")
    if agent_role is None and agent_id is not None:
        agent_role = "lead" if agent_id == "lead" else "subagent"

    program_id = explicit_program_id
    if program_id is None and task_id is not None and agent_id is not None:
        program_id = _scoped_program_id(task_id, agent_id)
    if program_id is None:
        return None
    placement_key = task_id or session_id or program_id
    _check_bounds((("program_id", program_id), ("placement key", placement_key)))

    parent_program_id = _string(context, "parent_program_id", "parent_id")
    parent_agent = _string(context, "parent_agent_id") or framework.parent_agent
    parent_agent = _normalized_agent(task_id, parent_agent)
    if parent_program_id is None and parent_agent is not None:
        parent_program_id = _related_program_id(program_id, agent_id, parent_agent, task_id)
    if parent_program_id is None and agent_role == "subagent":
        parent_program_id = _related_program_id(program_id, agent_id, "lead", task_id)
    root_program_id = _string(context, "root_program_id", "root_id")
    blocks_parent = _bool(context, "blocks_parent", "blocking_parent")
    if blocks_parent is None:
        blocks_parent = agent_role == "subagent"
    if parent_program_id == program_id:
        raise InvalidIdentity("parent_program_id must differ from program_id")
    if blocks_parent and parent_program_id is None:
        raise InvalidIdentity("blocks_parent requires parent_program_id")
    expected_resume = _bool(context, "expected_resume")
    if expected_resume is None:
        # A blocking subagent is expected to finish and hand control back, not to come back itself.
        expected_resume = not (blocks_parent and agent_role == "subagent")
    late_bounds_error = _late_bounds_error(
        task_id, session_id, agent_id, parent_program_id, root_program_id, agent_role
    )
    return _Base(
        program_id,
        placement_key,
        task_id,
        session_id,
        agent_id,
        agent_role,
        parent_program_id,
        root_program_id,
        blocks_parent,
        expected_resume,
        late_bounds_error,
    )


def _canonical_tail(context: Mapping[str, Any]) -> _Tail:
    """The fields read after the hash key: spawn reason, step id and the request's hints."""
    spawn_reason = _string(context, "spawn_reason", "subagent_type", "agent_type")
    step_id = _u64(context, "step_id")
    hints = RequestHints(
        request_id=_string(context, "request_id"),
        priority=_i64(context, "priority") or 0,
        deadline_seconds=_duration(context, "deadline", "deadline_seconds"),
        expected_output_tokens=_u64(context, "expected_output_length", "expected_output_tokens"),
        kv_retention_ttl_seconds=_duration(context, "kv_retention_ttl", "kv_retention_ttl_seconds"),
    )
    late_bounds_error = _bounds_error((("spawn_reason", spawn_reason), ("request_id", hints.request_id)))
    return _Tail(spawn_reason, step_id, hints, late_bounds_error)


def _agent_hint_identity(
    request: Mapping[str, Any] | None, hash_key: Callable[[], str]
) -> tuple[ProgramIdentity, RequestHints] | None:
    """Dynamo-style ``agent_hint``: the session is the Program; blocking children must name their parent."""
    raw = request.get("agent_hint") if request is not None else None
    if raw is None:
        return None
    if not is_mapping(raw):
        raise InvalidIdentity("agent_hint must be an object")
    session_id = _string(raw, "session_id")
    if session_id is None:
        raise InvalidIdentity("agent_hint.session_id is required")
    parent = _string(raw, "parent_session_id")
    blocks_parent = _bool(raw, "blocks_parent")
    if blocks_parent is None:
        blocks_parent = True
    if blocks_parent and parent is None:
        raise InvalidIdentity("blocking agent_hint requires parent_session_id")
    expected_resume = _bool(raw, "expected_resume")
    if expected_resume is None:
        expected_resume = not blocks_parent
    _check_bounds((("program_id", session_id), ("placement key", session_id)))
    identity = ProgramIdentity(
        program_id=session_id,
        placement_key=session_id,
        placement_hash_key=hash_key(),
        session_id=session_id,
        parent_program_id=parent,
        blocks_parent=blocks_parent,
        expected_resume=expected_resume,
        source=SOURCE_AGENT_HINT,
    )
    _check_late_bounds(identity)
    return identity, RequestHints()


def _header_identity(
    headers: Mapping[str, str], hash_key: Callable[[], str]
) -> tuple[ProgramIdentity, RequestHints] | None:
    """Identity from one framework header schema alone (``auto`` only)."""
    framework = _framework_headers(headers)
    return _session_identity(framework, hash_key, f"header:{framework.schema}")


def _session_identity(
    framework: _FrameworkHeaders, hash_key: Callable[[], str], source: str
) -> tuple[ProgramIdentity, RequestHints] | None:
    """The identity one session (with its actor and parent actor) names: the derivation every header
    schema shares, spec or extension."""
    session = framework.session
    if session is None:
        return None
    actor = _normalized_agent(session, framework.agent)
    is_lead = actor is None or actor == "lead"
    program_id = _scoped_program_id(session, actor)
    _check_bounds((("program_id", program_id), ("placement key", session)))
    role = "lead" if is_lead else "subagent"
    parent_agent = _normalized_agent(session, framework.parent_agent)
    if parent_agent is not None:
        parent: str | None = _scoped_program_id(session, parent_agent)
    else:
        parent = None if is_lead else _scoped_program_id(session, "lead")
    identity = ProgramIdentity(
        program_id=program_id,
        placement_key=session,
        placement_hash_key=hash_key(),
        task_id=session,
        session_id=session,
        agent_id=actor,
        agent_role=role,
        parent_program_id=parent,
        blocks_parent=not is_lead,
        # Codex ``thread-id=worker`` is a worker thread that is not expected to come back.
        expected_resume=is_lead,
        source=source,
    )
    _check_late_bounds(identity)
    return identity, RequestHints()


def _extension_identity(
    request: Mapping[str, Any] | None, headers: Mapping[str, str], model_pool: str | None
) -> tuple[ProgramIdentity, RequestHints] | None:
    """Beyond the spec: the session the harness itself names, when no spec source is present — Claude
    Code's ``metadata.user_id`` (with its agent headers), else the first extension header schema present.
    The placement hash key is the session's own, so all of a session's Programs share one."""
    session = _claude_metadata_session(request)
    if session is not None:
        framework = _FrameworkHeaders(
            SOURCE_CLAUDE_METADATA,
            session,
            _header_value(headers, CLAUDE_AGENT_HEADER),
            _header_value(headers, CLAUDE_PARENT_AGENT_HEADER),
        )
        key = f"metadata.user_id:session:{session}"
        source = SOURCE_CLAUDE_METADATA
    else:
        framework = _NO_FRAMEWORK
        key = source = ""
        for schema in EXTENSION_SCHEMAS:
            value = _header_value(headers, schema.session)
            if value is not None:
                agent = _header_value(headers, schema.agent) if schema.agent else None
                framework = _FrameworkHeaders(schema.name, value, agent, None)
                key = f"header:{schema.session}:{value}"
                source = f"header:{schema.name}"
                break
        if framework.session is None:
            return None

    def hash_key() -> str:
        if model_pool is not None:
            _check_bounds((("model pool", model_pool),))
        if _too_long(key, MAX_PLACEMENT_HASH_KEY_BYTES):
            raise InvalidIdentity(f"placement hash key exceeds {MAX_PLACEMENT_HASH_KEY_BYTES} bytes")
        return key

    return _session_identity(framework, hash_key, source)


def _claude_metadata_session(request: Mapping[str, Any] | None) -> str | None:
    """The session id Claude Code's ``metadata.user_id`` carries, or None when it carries none we know:
    a JSON object string with ``session_id``, or ``user_<hash>_account_<uuid>_session_<uuid>``. The field
    is the client's own (any Messages client may set it), so a value of another form is not an error."""
    metadata = request.get("metadata") if request is not None else None
    if metadata is None or not is_mapping(metadata):
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or _too_long(user_id, MAX_AGENTIC_CONTEXT_BYTES):
        return None
    text = user_id.strip()
    if text.startswith("{"):
        try:
            decoded = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        session = decoded.get("session_id") if is_mapping(decoded) else None
        if not isinstance(session, str):
            return None
        return session.strip() or None
    if text.startswith("user_"):
        _head, found, session = text.rpartition(_LEGACY_USER_ID_SESSION)
        if found and session and all(ch in "0123456789abcdefABCDEF-" for ch in session):
            return session
    return None


# ----------------------------------------------------------------------------------------------- headers


def _lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The schema headers under lower-case names (first one wins), whatever the mapping's case rules."""
    if answers_any_case(headers):  # ask for the few names rather than lower-case every header
        return {name: value for name in _SCHEMA_HEADERS if (value := headers.get(name)) is not None}
    out: dict[str, str] = {}
    for key, value in headers.items():
        name = key.lower()
        if name in _SCHEMA_HEADERS and name not in out:
            out[name] = value
    return out


def _header_value(headers: Mapping[str, str], name: str) -> str | None:
    """Trimmed, non-empty header value; a value that is not visible ASCII is an error, as in ``http``."""
    value = headers.get(name)
    if value is None:
        return None
    if not all(ch == "\t" or " " <= ch <= "~" for ch in value):
        raise InvalidIdentity(f"Invalid {name} header")
    return value.strip() or None


def _framework_headers(headers: Mapping[str, str]) -> _FrameworkHeaders:
    if not headers:  # the usual request: no framework header at all
        return _NO_FRAMEWORK
    for schema in HEADER_SCHEMAS:
        session = _header_value(headers, schema.session)
        if session is None:
            continue
        agent = _header_value(headers, schema.agent) if schema.agent else None
        parent = _header_value(headers, schema.parent) if schema.parent else None
        return _FrameworkHeaders(schema.name, session, agent, parent)
    return _NO_FRAMEWORK


def _placement_hash_key(
    headers: Mapping[str, str],
    lowered: Mapping[str, str],
    request: Mapping[str, Any] | None,
    raw_body: bytes | None,
    digest_body: bool,
) -> str:
    """Framework session header first, else the native consistent-hash key, so both paths agree."""
    for name in _PLACEMENT_SESSION_HEADERS if lowered else ():
        try:
            value = _header_value(lowered, name)
        except InvalidIdentity:
            continue
        if value is not None:
            return f"header:{name}:{value}"
    if raw_body is None:
        raw_body = orjson.dumps(dict(request)) if request is not None else b""
    return native_hash_key(headers, request, raw_body, digest=digest_body)


# ------------------------------------------------------------------------------------------------ fields


def _string(context: Mapping[str, Any], *keys: str) -> str | None:
    """First non-null of ``keys`` as a trimmed identifier; integers are accepted as identifiers."""
    for key in keys:
        value = context.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            text = value.strip()
        elif isinstance(value, int) and not isinstance(value, bool) and _I64_MIN <= value <= _U64_MAX:
            text = str(value)
        else:
            raise InvalidIdentity(f"{key} must be a string-compatible identifier")
        if not text:
            raise InvalidIdentity(f"{key} must not be empty")
        return text
    return None


def _bool(context: Mapping[str, Any], *keys: str) -> bool | None:
    for key in keys:
        value = context.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise InvalidIdentity(f"{key} must be a boolean")
        return value
    return None


def _u64(context: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = context.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
            raise InvalidIdentity(f"{key} must be a non-negative integer")
        return value
    return None


def _i64(context: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = context.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not _I64_MIN <= value <= _I64_MAX:
            raise InvalidIdentity(f"{key} must be an integer")
        return value
    return None


def _duration(context: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = context.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidIdentity(f"{key} must be seconds as a number")
        seconds = float(value)
        if not seconds >= 0.0 or seconds == float("inf"):
            raise InvalidIdentity(f"{key} must be finite and non-negative")
        return seconds
    return None


# ------------------------------------------------------------------------------------------- derivation


def _scoped_program_id(scope: str, actor: str | None) -> str:
    """``"<scope>:<actor>"`` (actor defaults to lead), without doubling an existing scope prefix."""
    actor = actor or "lead"
    prefix = f"{scope}:"
    return actor if actor.startswith(prefix) else prefix + actor


def _normalized_agent(scope: str | None, agent: str | None) -> str | None:
    """Strip a ``"<scope>:"`` prefix from an agent id; an empty remainder names no agent and is an error."""
    if agent is None or scope is None:
        return agent
    prefix = f"{scope}:"
    if not agent.startswith(prefix):
        return agent
    component = agent[len(prefix) :]
    if not component:
        raise InvalidIdentity("agent_id must include an agent component")
    return component


def _related_program_id(
    program_id: str, agent_id: str | None, related: str, task_id: str | None
) -> str | None:
    """The sibling Program of ``related``: swap the ``:<agent>`` suffix, else scope it under the task."""
    if agent_id is not None:
        suffix = f":{agent_id}"
        if program_id.endswith(suffix):
            return f"{program_id[: -len(suffix)]}:{related}"
    return _scoped_program_id(task_id, related) if task_id is not None else None


def _check_bounds(fields: Sequence[tuple[str, str | None]]) -> None:
    error = _bounds_error(fields)
    if error is not None:
        raise InvalidIdentity(error)


def _check_late_bounds(identity: ProgramIdentity) -> None:
    """An agent hint's or a header identity's late bounds (it has no spawn reason or request id)."""
    error = _late_bounds_error(
        identity.task_id,
        identity.session_id,
        identity.agent_id,
        identity.parent_program_id,
        identity.root_program_id,
        identity.agent_role,
    )
    if error is not None:
        raise InvalidIdentity(error)


def _late_bounds_error(
    task_id: str | None,
    session_id: str | None,
    agent_id: str | None,
    parent_program_id: str | None,
    root_program_id: str | None,
    agent_role: str | None,
) -> str | None:
    """The first exceeded bound of the identity's fields checked last (its model pool, Program id and
    placement keys are checked as it is built), in upstream's order; a canonical context's spawn reason
    and request id follow them."""
    return _bounds_error(
        (
            ("task_id", task_id),
            ("session_id", session_id),
            ("agent_id", agent_id),
            ("parent_program_id", parent_program_id),
            ("root_program_id", root_program_id),
            ("agent_role", agent_role),
        )
    )


def _bounds_error(fields: Sequence[tuple[str, str | None]]) -> str | None:
    """Why the first of ``fields`` over its bound is refused (None: all within)."""
    for name, value in fields:
        if value is not None and _too_long(value, MAX_IDENTITY_COMPONENT_BYTES):
            return f"{name} exceeds {MAX_IDENTITY_COMPONENT_BYTES} bytes"
    return None


def _too_long(value: str, limit: int) -> bool:
    """More than ``limit`` bytes in UTF-8 (encoded only when it could be: a character is at most 4 bytes)."""
    return len(value) * 4 > limit and len(value.encode()) > limit
