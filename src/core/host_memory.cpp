// Host memory checks from /proc/meminfo's MemAvailable (what the kernel estimates can be allocated
// without swapping).
#include "core/host_memory.h"

#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/format.h"

std::optional<size_t> parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    unsigned long long kib = 0;
    std::string unit;
    if (!(fields >> kib >> unit) || unit != "kB" || kib > (~size_t(0) >> 10)) return std::nullopt;
    return static_cast<size_t>(kib) << 10;
  }
  return std::nullopt;
}

void require_host_memory(size_t need, const std::string& what, size_t available) {
  if (need <= available) return;
  throw InputError(what + " needs " + format_bytes(need) + " of host memory, but only " + format_bytes(available) +
                   " are available (MemAvailable in /proc/meminfo)");
}

std::optional<size_t> read_mem_available(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream text;
  text << f.rdbuf();
  return parse_mem_available(text.str());
}

void require_host_memory(size_t need, const std::string& what) {
  if (const std::optional<size_t> available = read_mem_available()) require_host_memory(need, what, *available);
}
