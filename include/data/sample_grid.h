// A PNG of augmented training images, to see what the model sees (--sample-png).
#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"

// Tiles `count` side x side uint8 images (as assembled by the loader: `channels` 1 or 3, in `layout`)
// into a grid 8 wide with 2-pixel gaps and writes it as PNG. Fatal naming the path on failure.
void write_sample_grid(const std::string& path, const uint8_t* images, int count, int channels, int side,
                       Layout layout);
