"""The byte layout of a zip file, read from its bytes (not with ``zipfile``), for tests that damage
checkpoint files field by field: https://pkware.cachefly.net/webdocs/casestudies/APPNOTE.TXT (4.3.7,
4.3.12, 4.3.16)."""

import struct

# (offset, size) of the fields of a local header, a central-directory entry and the end record
LOCAL_FIELDS = {"version": (4, 2), "flags": (6, 2), "method": (8, 2), "crc": (14, 4), "compressed size": (18, 4),
                "size": (22, 4), "name length": (26, 2), "extra length": (28, 2)}
CENTRAL_FIELDS = {"version made by": (4, 2), "version": (6, 2), "flags": (8, 2), "method": (10, 2), "crc": (16, 4),
                  "compressed size": (20, 4), "size": (24, 4), "name length": (28, 2), "extra length": (30, 2),
                  "comment length": (32, 2), "disk": (34, 2), "internal attributes": (36, 2),
                  "external attributes": (38, 4), "offset": (42, 4)}
END_FIELDS = {"disk": (4, 2), "directory disk": (6, 2), "entries here": (8, 2), "entries": (10, 2),
              "directory size": (12, 4), "directory offset": (16, 4), "comment length": (20, 2)}


def zip_headers(raw):
    """``(kind, start, length)`` of every local header (with name and extra), central-directory entry
    (with name, extra, comment), the zip64 end record and its locator where there are (``"end64"``), and
    the end record, read from the bytes."""
    end = raw.rfind(b"PK\x05\x06")
    entries, directory_size, directory = struct.unpack("<HII", raw[end + 10: end + 20])
    out = [("end", end, len(raw) - end)]
    if raw[end - 20: end - 16] == b"PK\x06\x07":  # a zip64 end record and its locator precede the end record
        end64 = struct.unpack("<Q", raw[end - 12: end - 4])[0]
        assert raw[end64: end64 + 4] == b"PK\x06\x06"
        out.append(("end64", end64, end - end64))
        end = end64
    assert raw[directory: directory + 4] == b"PK\x01\x02" and directory + directory_size == end
    at = directory
    for _ in range(entries):
        name, extra, comment = struct.unpack("<HHH", raw[at + 28: at + 34])
        local = struct.unpack("<I", raw[at + 42: at + 46])[0]
        length = 46 + name + extra + comment
        out.append(("central", at, length))
        local_name, local_extra = struct.unpack("<HH", raw[local + 26: local + 30])
        assert raw[local: local + 4] == b"PK\x03\x04"
        out.append(("local", local, 30 + local_name + local_extra))
        at += length
    assert at == end
    return out
