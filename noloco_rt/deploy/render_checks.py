"""What `noloco-rt k8s render` checks before it prints anything (pure, no I/O): a manifest
set whose workers would crash-loop, or whose image no registry could serve, is refused in
one line instead of being rendered.
"""

from __future__ import annotations

import re
import tomllib

from noloco_rt.config import ConfigError, load_config

# An image reference as a registry resolves it: [host[:port]/]path[:tag][@digest]. Path
# components are lowercase; tags up to 128 characters; digests algorithm:hex.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_IMAGE = re.compile(rf"^{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                    rf"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{{32,}})?$")
MAX_IMAGE_LENGTH = 255


def check_image_reference(image: str) -> None:
    """Raise ConfigError unless `image` is a well-formed image reference."""
    if len(image) > MAX_IMAGE_LENGTH or not _IMAGE.match(image):
        raise ConfigError("--image", image, "not an image reference: [registry[:port]/]name[:tag][@sha256:digest], "
                                            "lowercase name, e.g. ghcr.io/me/noloco-rt:0.1.0-cuda")


def check_rendered_config(text: str) -> None:
    """Load the ConfigMap's config.toml as every pod will (the real loader, no environment):
    an invalid value, such as more stages than the preset has layers, is refused here."""
    try:
        load_config(environ={}, overrides=[tomllib.loads(text)])
    except ConfigError as exc:
        raise ConfigError(exc.field_name, exc.value,
                          f"{exc.allowed} (the rendered config.toml would crash-loop every pod)") from None
