# Third-party dependencies, all from Debian packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

# cpp-httplib: found by header and library (its .pc file pulls in openssl/zlib/brotli .pc files).
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib REQUIRED)
add_library(httplib::httplib UNKNOWN IMPORTED)
set_target_properties(httplib::httplib PROPERTIES IMPORTED_LOCATION "${HTTPLIB_LIBRARY}"
                      INTERFACE_INCLUDE_DIRECTORIES "${HTTPLIB_INCLUDE_DIR}"
                      INTERFACE_COMPILE_DEFINITIONS "CPPHTTPLIB_THREAD_POOL_COUNT=16")

# CUDA: optional; built when nvcc exists (CI compiles it even without a GPU).
set(TM_HAVE_CUDA OFF)
if(NOT TM_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TM_HAVE_CUDA ON)
  elseif(TM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TM_CUDA=ON but no CUDA compiler was found (install the CUDA toolkit or pass -DTM_CUDA=OFF)")
  endif()
endif()
message(STATUS "tokenmill: CUDA backend ${TM_HAVE_CUDA}")
