/* vm_proto.h: the exec protocol between a microVM's host side (runtime/microvm.hpp)
 * and its guest agent (tools/guest/dsec_guest.c, the initramfs's /init).
 *
 * A C header: the guest agent is a small static C program. Both ends are built
 * from the same tree, so there is no versioning. The channel is a virtio-serial
 * port (named vm_port_name in the guest, a socketpair end given to QEMU on the
 * host): a byte stream, so every message is a frame: a vm_frame header, then
 * `len` bytes of payload (at most vm_max_payload). Integers are little-endian
 * (both ends are x86-64). Whoever receives a frame checks magic and length
 * before it trusts it; the host treats the guest as untrusted.
 */
#ifndef DSEC_VM_PROTO_H
#define DSEC_VM_PROTO_H

#include <stdint.h>

#define VM_MAGIC 0x6d766473u /* "sdvm" */
#define VM_MAX_PAYLOAD (1u << 20)
#define VM_PORT_NAME "dsec.agent"
#define VM_MAX_GROUPS 256/* supplementary groups of an exec, at most */
/* The serial of layer disk i (topmost first) is VM_LAYER_SERIAL_PREFIX "i". */
#define VM_LAYER_SERIAL_PREFIX "dsec-l"

enum vm_type {
  /* guest -> host */
  VM_READY = 1,       /* the root is up: payload = vm_ready */
  VM_BOOT_FAILED = 2, /* payload = text; the guest powers off */
  VM_STARTED = 3,     /* id: the command runs; payload = int32 pid */
  VM_OUTPUT = 4,      /* id: bytes; flags = 1 stdout, 2 stderr */
  VM_EXITED = 5,      /* id: payload = int32 wait status */
  VM_DONE = 6,        /* id: put/get/exec-start finished; payload = int32 errno, then text */
  VM_DATA = 7,        /* id: a chunk of a file asked for by VM_GET */
  /* host -> guest */
  VM_EXEC = 16,       /* id: payload = uint32 argc, envc, uid, gid, ngroups, uint32 groups[ngroups],
                         then cwd\0 argv..\0 env..\0 */
  VM_STDIN = 17,      /* id: bytes for its stdin; an empty payload closes it */
  VM_SIGNAL = 18,     /* id: payload = int32 signal number, sent to its process group */
  VM_PUT = 19,        /* id: payload = uint32 mode, path\0, content (one frame) */
  VM_GET = 20,        /* id: payload = path\0 */
  VM_POWEROFF = 21    /* sync and power off (QEMU runs with -no-reboot: it exits) */
};

struct vm_frame {
  uint32_t magic;
  uint32_t len;   /* payload bytes that follow */
  uint16_t type;  /* enum vm_type */
  uint16_t flags;
  uint32_t id;    /* the command or transfer it belongs to (chosen by the host) */
};

/* Milliseconds of CLOCK_BOOTTIME in the guest (since its kernel started) when
 * each boot step ended: the share of boot that is the kernel vs the agent. */
struct vm_ready {
  uint32_t agent_start_ms; /* /init began: the kernel's part ends here */
  uint32_t modules_ms;     /* the modules are loaded */
  uint32_t disks_ms;       /* every layer disk is there */
  uint32_t root_ms;        /* layers mounted, overlay made: ready */
};

#endif
