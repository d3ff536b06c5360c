// The tokenmill command line: one subcommand per file in src/app/ (cmd_*.cpp).
#pragma once

namespace tokenmill::app {

int main(int argc, char** argv);

}  // namespace tokenmill::app
