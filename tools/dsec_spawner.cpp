// dsec-spawner: the zygote every dsec process starts (see runtime/zygote.hpp).
#include "runtime/zygote.hpp"

int main(int argc, char** argv) {
  return dsec::zygote_main(argc, argv);
}
