// tokenmill: the command-line entry point. Everything lives in src/app/.
#include "app/cli.h"

int main(int argc, char** argv) {
  return tokenmill::app::main(argc, argv);
}
