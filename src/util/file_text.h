// Whole small files (configs, prompts, token-id lists) read into memory.
#pragma once

#include <string>

namespace tokenmill {

// The bytes of the file at `path`. Throws tokenmill::Error naming the path when it cannot be
// opened or read.
std::string read_text_file(const std::string& path);

}  // namespace tokenmill
