// Numbers and dates as the programs print them.
#pragma once

#include <cstddef>
#include <string>

std::string with_commas(long long v);      // 15634 -> "15,634"
std::string clock_text(double seconds);    // 3725 -> "1:02:05"
std::string today();                       // "2026-11-23", local time
std::string format_bytes(size_t bytes);   // "1.50 GiB", "12.0 MiB": for messages
