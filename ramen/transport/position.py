"""Stream position arithmetic, as Aeron's LogBufferDescriptor does it.

A position counts bytes since the start of the stream: ((termId - initialTermId) << log2(termLength))
+ termOffset. Term ids are signed 32-bit and wrap, so the difference is taken modulo 2**32.
"""

PARTITION_COUNT = 3


def int32(value: int) -> int:
    """Wrap a Python int to a signed 32-bit value, as Java arithmetic would."""
    return ((value + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def position_bits_to_shift(term_length: int) -> int:
    return term_length.bit_length() - 1


def compute_position(term_id: int, term_offset: int, bits: int, initial_term_id: int) -> int:
    term_count = int32(term_id - initial_term_id)
    return (term_count << bits) + term_offset


def term_id_of(position: int, bits: int, initial_term_id: int) -> int:
    return int32(initial_term_id + (position >> bits))


def index_by_position(position: int, bits: int) -> int:
    return (position >> bits) % PARTITION_COUNT


def index_by_term_count(term_count: int) -> int:
    return term_count % PARTITION_COUNT


def max_possible_position(term_length: int) -> int:
    """Past this, term ids would repeat within one stream: offers get MAX_POSITION_EXCEEDED."""
    return term_length * (1 << 31)
