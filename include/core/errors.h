// The two kinds of error the trainer reports on one line.
//
// Fatal: something failed (a CUDA/cuDNN/cuBLAS call, memory); InputError: the user's input (a file,
// the environment) is wrong. main() prints either as "error: <message>" and exits 1; nothing calls
// exit() from deep inside, so RAII owners clean up first and nothing already saved is touched.
#pragma once

#include <stdexcept>

struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InputError : Fatal {
  using Fatal::Fatal;
};
