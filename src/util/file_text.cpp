#include "util/file_text.h"

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace tokenmill {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open the file; check that it exists and is readable", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("{}: cannot read the file", path);
  return ss.str();
}

}  // namespace tokenmill
