"""A subscription: one reader over several images, added and removed while it runs.

A worker's input is one subscription with an image per parent or replayer publication. Polls
start from a rotating image so no image starves the others (as Aeron's Subscription does).
"""

from __future__ import annotations

import logging

from ramen.transport.image import BlockHandler, ControlledFragmentHandler, FragmentHandler, Image

log = logging.getLogger(__name__)


class Subscription:
    def __init__(self, images: list[Image] | None = None) -> None:
        self._images: list[Image] = list(images or [])
        self._round_robin = 0

    @property
    def images(self) -> tuple[Image, ...]:
        return tuple(self._images)

    def add_image(self, image: Image) -> None:
        self._images.append(image)

    def remove_image(self, image: Image, *, close: bool = True) -> None:
        """Stop reading an image (its subscriber position is released when closed)."""
        if image in self._images:
            self._images.remove(image)
        if close:
            image.close()

    def keep_alive(self) -> None:
        """Heartbeat every image without reading (see Image.keep_alive)."""
        for image in self._images:
            image.keep_alive()

    def close(self) -> None:
        for image in self._images:
            image.close()
        self._images.clear()

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        return self._each(lambda image, limit: image.poll(handler, limit), fragment_limit)

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        return self._each(lambda image, limit: image.controlled_poll(handler, limit), fragment_limit)

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        return sum(image.block_poll(handler, block_length_limit) for image in self._reap())

    def _each(self, poll_one, fragment_limit: int) -> int:
        images = self._reap()
        count = len(images)
        if not count:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            if fragments >= fragment_limit:
                break
            fragments += poll_one(images[(start + i) % count], fragment_limit - fragments)
        return fragments

    def _reap(self) -> list[Image]:
        """Drop images that closed themselves (dropped by their writer)."""
        if any(image.is_closed for image in self._images):
            for image in [i for i in self._images if i.is_closed]:
                log.info("removing closed image %s at position %d", image.name, image.position)
                self._images.remove(image)
        return self._images
