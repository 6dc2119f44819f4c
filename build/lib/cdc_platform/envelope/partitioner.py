"""Kafka's default partitioner for keyed records, bit-for-bit as the Java client does it
(``Utils.toPositive(Utils.murmur2(key)) % numPartitions``). librdkafka's ``murmur2_random``
is the same function; having it here lets tests and the lake side predict partitions."""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (unsigned 32-bit result)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    rounded = length & ~3
    for i in range(0, rounded, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[rounded + 2] << 16
    if rest >= 2:
        h ^= data[rounded + 1] << 8
    if rest >= 1:
        h ^= data[rounded]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
