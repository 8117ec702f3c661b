"""Label values that come from an SGLang server: bounded, printable, and never a secret.

A server (or something posing as one) chooses these strings, and each is copied into every
series that carries it, so they are cut down before they become label values:

- Length and charset (`safe_value`): a value of at most MAX_LABEL_CHARS printable characters
  is kept as it is. A longer one, or one with a control or other non-printable character, is
  replaced by its first TRUNCATED_CHARS characters (each non-printable one as `_`), `~` and
  the first 12 hex digits of the SHA-256 of the whole value: distinct values stay distinct.
- Credentials (`looks_like_credential`): a value that looks like one (`token=`, `key=`,
  `password`, `secret`, a Hugging Face `hf_...` or OpenAI `sk-...` token, a JWT, URL userinfo
  `user:pw@`) is never exported, not even in part: it becomes REDACTED.
- Model names (`model_name`): a local path (starting with `/`, `~` or `.`, holding `\\`, `://`
  or more than one `/`) is reduced to its last component; a Hugging Face id `org/name` (one
  `/`) is kept, so it still equals the `model_name` label on SGLang's own /metrics.
- Enumerated fields (`version`, `enum_value`): a value of no known shape becomes OTHER.
"""

from __future__ import annotations

import hashlib
import re

MAX_LABEL_CHARS = 128
TRUNCATED_CHARS = 100
CHECKED_CHARS = 2 * MAX_LABEL_CHARS
OTHER = "other"
REDACTED = "redacted"

_CREDENTIAL = re.compile(
    r"(token|key|secret|passw(or)?d|pwd|auth|credential|signature|sig)\s*[=:]"
    r"|secret|password|passwd|bearer"
    r"|hf_[a-z0-9]{8,}"  # Hugging Face
    r"|sk-[a-z0-9_-]{8,}"  # OpenAI style
    r"|gh[pousr]_[a-z0-9]{8,}"  # GitHub
    r"|eyj[a-z0-9_-]{8,}\.[a-z0-9_-]{4,}"  # a JWT
    r"|[^\s/@:]+:[^\s/@]*@",  # URL userinfo user:password@
    re.IGNORECASE,
)
_VERSION = re.compile(r"v?\d{1,4}(\.\d{1,6}){0,3}([.+-]?(post|rc|dev|a|b)\d{0,8})*")


def safe_value(value: str) -> str:
    """`value` if short and printable, else its documented safe form (module docstring)."""
    if len(value) <= MAX_LABEL_CHARS and value.isprintable():
        return value
    head = "".join(c if c.isprintable() else "_" for c in value[:TRUNCATED_CHARS])
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{head}~{digest}"


def looks_like_credential(value: str) -> bool:
    """Whether the part of `value` that could be exported (its first CHECKED_CHARS characters:
    the kept head of a long value plus a margin) looks like it holds a credential. Only that
    part is searched, so a huge value costs no more than a short one."""
    return _CREDENTIAL.search(value[:CHECKED_CHARS]) is not None


def model_name(value: str) -> str:
    """A model name as a label value: path reduced, credentials redacted, length capped."""
    if not value:
        return ""
    if _is_path(value):
        value = value.rstrip("/\\")
        value = value[max(value.rfind("/"), value.rfind("\\")) + 1:]
    if looks_like_credential(value):
        return REDACTED
    return safe_value(value)


def _is_path(value: str) -> bool:
    return (value.startswith(("/", "~", ".")) or "\\" in value or "://" in value
            or value.count("/") > 1)


def version(value: str) -> str:
    """A release number (0.5.23, 0.4.6.post5, 0.5.0rc2, 0.5.1.dev3); anything else OTHER."""
    if not value:
        return ""
    return value if len(value) <= 40 and _VERSION.fullmatch(value) else OTHER


def enum_value(value: str, known: frozenset[str]) -> str:
    """`value` if it is one of `known` (compared case-insensitively), else OTHER."""
    if not value:
        return ""
    return value if value.lower() in known else OTHER


# The values SGLang's server_args accepts (or reports) for the enumerated config labels.
SCHEDULE_POLICIES = frozenset({"lpm", "random", "fcfs", "dfs-weight", "lof", "priority",
                               "routing-key", "hrrn", "shortest-prefill-first"})
KV_CACHE_DTYPES = frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "bf16",
                             "bfloat16", "fp16", "float16", "fp32", "float32", "int8",
                             "int4", "nvfp4", "mxfp4"})
SPECULATIVE_ALGORITHMS = frozenset({"eagle", "eagle3", "nextn", "standalone", "ngram",
                                    "lookahead", "medusa", "dflash"})
DISAGGREGATION_MODES = frozenset({"null", "prefill", "decode"})
