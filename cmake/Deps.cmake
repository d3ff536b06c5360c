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

# cpp-httplib: found by header and library (its .pc file pulls in openssl/zlib/brotli .pc files,
# which a prefix unpacked from .deb files may lack). Debian builds the library with OpenSSL, zlib
# and Brotli support, and those switches change the layout of its classes: every translation unit
# must see the same CPPHTTPLIB_* definitions as the library, or a Client is freed with the wrong
# size. They are read from the Cflags line of its .pc file, and the headers they pull in found.
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib REQUIRED)
get_filename_component(HTTPLIB_LIBDIR "${HTTPLIB_LIBRARY}" DIRECTORY)
find_file(HTTPLIB_PC cpp-httplib.pc HINTS "${HTTPLIB_LIBDIR}/pkgconfig" NO_DEFAULT_PATH)
set(HTTPLIB_DEFINITIONS CPPHTTPLIB_THREAD_POOL_COUNT=16)
set(HTTPLIB_INCLUDE_DIRS "${HTTPLIB_INCLUDE_DIR}")
if(HTTPLIB_PC)
  file(STRINGS "${HTTPLIB_PC}" httplib_cflags REGEX "^Cflags:")
  string(REGEX MATCHALL "-D[A-Za-z0-9_=]+" httplib_defs "${httplib_cflags}")
  foreach(d ${httplib_defs})
    string(SUBSTRING "${d}" 2 -1 d)
    list(APPEND HTTPLIB_DEFINITIONS "${d}")
  endforeach()
endif()
if("CPPHTTPLIB_OPENSSL_SUPPORT" IN_LIST HTTPLIB_DEFINITIONS)
  find_path(HTTPLIB_SSL_DIR openssl/ssl.h REQUIRED)
  find_path(HTTPLIB_SSL_CONF_DIR openssl/configuration.h
            PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE} x86_64-linux-gnu REQUIRED)
  list(APPEND HTTPLIB_INCLUDE_DIRS "${HTTPLIB_SSL_DIR}" "${HTTPLIB_SSL_CONF_DIR}")
endif()
if("CPPHTTPLIB_ZLIB_SUPPORT" IN_LIST HTTPLIB_DEFINITIONS)
  find_path(HTTPLIB_ZLIB_DIR zlib.h REQUIRED)
  list(APPEND HTTPLIB_INCLUDE_DIRS "${HTTPLIB_ZLIB_DIR}")
endif()
if("CPPHTTPLIB_BROTLI_SUPPORT" IN_LIST HTTPLIB_DEFINITIONS)
  find_path(HTTPLIB_BROTLI_DIR brotli/decode.h REQUIRED)
  list(APPEND HTTPLIB_INCLUDE_DIRS "${HTTPLIB_BROTLI_DIR}")
endif()
list(REMOVE_DUPLICATES HTTPLIB_INCLUDE_DIRS)
message(STATUS "cpp-httplib: ${HTTPLIB_LIBRARY} (${HTTPLIB_DEFINITIONS})")
add_library(httplib::httplib UNKNOWN IMPORTED)
set_target_properties(httplib::httplib PROPERTIES IMPORTED_LOCATION "${HTTPLIB_LIBRARY}"
                      INTERFACE_INCLUDE_DIRECTORIES "${HTTPLIB_INCLUDE_DIRS}"
                      INTERFACE_COMPILE_DEFINITIONS "${HTTPLIB_DEFINITIONS}")

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
