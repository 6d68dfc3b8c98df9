"""What `noloco-rt k8s render` checks before it prints anything (pure, no I/O): a manifest
set whose workers would crash-loop, or whose image no registry could serve, is refused in
one line instead of being rendered.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from noloco_rt.config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from noloco_rt.deploy.k8s_profile import Profile

# An image reference as a registry resolves it: [host[:port]/]path[:tag][@digest]. Path
# components are lowercase; tags up to 128 characters; digests algorithm:hex.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_IMAGE = re.compile(rf"^{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                    rf"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{{32,}})?$")
MAX_IMAGE_LENGTH = 255
# The API server's limits: counts, probe thresholds and ports are int32; an Indexed Job has at
# most 100,000 completions.
INT32_MAX = 2**31 - 1
MAX_INDEXED_COMPLETIONS = 100_000
# A volume size as a PVC accepts it, in the plain forms people write (100Gi, 500G, 2Ti);
# "100GB" is the usual slip, and the API server would refuse it only at apply time.
_SIZE = re.compile(r"^[1-9][0-9]*(?:[KMGTP]i|[kMGTP])?$")
# A StorageClass name: a DNS subdomain (lowercase, digits, '-', '.').
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$")


def check_image_reference(image: str) -> None:
    """Raise ConfigError unless `image` is a well-formed image reference."""
    if len(image) > MAX_IMAGE_LENGTH or not _IMAGE.match(image):
        raise ConfigError("--image", image, "not an image reference: [registry[:port]/]name[:tag][@sha256:digest], "
                                            "lowercase name, e.g. ghcr.io/me/noloco-rt:0.1.0-cuda")


def check_profile(p: Profile) -> None:
    """Raise ConfigError for a value of the render's options that a cluster would refuse."""
    check_image_reference(p.image)
    if p.storage_class and (len(p.storage_class) > 253 or not _DNS_SUBDOMAIN.match(p.storage_class)):
        raise ConfigError("--storage-class", p.storage_class, "not a StorageClass name (lowercase letters, "
                                                              "digits, '-' and '.'), e.g. standard-rwx")
    if p.replicas > MAX_INDEXED_COMPLETIONS:
        raise ConfigError("--replicas", p.replicas, f"an Indexed Job runs at most {MAX_INDEXED_COMPLETIONS} "
                                                    "pods (one worker Job per stage)")
    for flag, size in (("--store-size", p.store_size), ("--data-size", p.data_size)):
        if size and not _SIZE.match(size):
            raise ConfigError(flag, size, "not a volume size: a whole number with Ki, Mi, Gi, Ti, Pi "
                                          "(or k, M, G, T, P), e.g. 200Gi")


def check_rendered_config(text: str) -> Config:
    """Load the ConfigMap's config.toml as every pod will (the real loader, no environment)
    and return it: an invalid value, such as more stages than the preset has layers, is
    refused here."""
    try:
        return load_config(environ={}, overrides=[tomllib.loads(text)])
    except ConfigError as exc:
        raise ConfigError(exc.field_name, exc.value,
                          f"{exc.allowed} (the rendered config.toml would crash-loop every pod)") from None


def check_manifest_numbers(docs: list[dict[str, Any]]) -> None:
    """Raise ConfigError naming the field of the first whole number the API server would refuse
    (int32 fields: replicas, probe thresholds, ports, grace periods as rendered here)."""
    for index, doc in enumerate(docs):
        for path, value in _numbers(doc, f"{doc.get('kind', 'object')}[{index}]"):
            if not 0 <= value <= INT32_MAX:
                raise ConfigError(path, value, f"must be between 0 and {INT32_MAX} (a Kubernetes int32): "
                                               "an option above implies it (e.g. --min-bandwidth sets the "
                                               "startup probe's failureThreshold)")


def _numbers(node: Any, path: str) -> Iterator[tuple[str, int]]:
    if isinstance(node, bool):
        return
    if isinstance(node, int):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{path}[{i}]")
