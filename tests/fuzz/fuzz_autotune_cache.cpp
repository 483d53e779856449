// libFuzzer target: the autotune cache file parser; what parses must format and parse back the same.
#include <cstdint>
#include <string>

#include "model/autotune_cache.h"
#include "core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const AutotuneEntries e = parse_autotune_cache(text, "fuzz.txt");
    const AutotuneEntries again = parse_autotune_cache(format_autotune_cache(e), "formatted");
    for (const auto& [ctx, here] : e)
      if (!here.empty() && (again.at(ctx).convs.size() != here.convs.size() ||
                            again.at(ctx).fused.size() != here.fused.size()))
        __builtin_trap();
  } catch (const InputError&) {
  }
  return 0;
}
