// Will it fit in host memory? Asked before a data set is read or generated, so that a run too large
// for the machine is one line saying how much it needs, not std::bad_alloc (or the OOM killer).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

// MemAvailable of /proc/meminfo text, in bytes; nullopt when the line is absent or malformed.
std::optional<size_t> parse_mem_available(const std::string& meminfo);
// MemAvailable of the file at `path` (/proc/meminfo; tests point it elsewhere); nullopt when the
// file cannot be read or has no such line.
std::optional<size_t> read_mem_available(const std::string& path = "/proc/meminfo");

// InputError "<what> needs N of host memory, but only M are available ..." when need > available.
void require_host_memory(size_t need, const std::string& what, size_t available);
// The same against this machine's MemAvailable; nothing is checked where /proc/meminfo is unreadable.
void require_host_memory(size_t need, const std::string& what);
