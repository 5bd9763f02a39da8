/* The smallest command a sandbox can run: exits with status 0 at once.
 * Linked statically (see perf/meson.build) so that exec costs no dynamic loading
 * and it runs in any root, with or without a libc. */
#include <unistd.h>

int main(void) {
  _exit(0);
}
