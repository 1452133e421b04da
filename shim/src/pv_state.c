/* The shim's per-process state: the context every callback gets, the
 * published callbacks, and how the boot went. Data only: every other file
 * reads it, none of them is needed to define it. */
#include "pv_shim.h"

pv_ctx_t pv_ctx = {.magic = PV_CTX_MAGIC, .n_entries = PV_N_ENTRIES};
void *pv_callbacks[PV_N_ENTRIES];
int pv_boot_state = -1; /* PV_BOOT_* once booted */
const char *pv_boot_mode = "none"; /* "native" once the callbacks are installed (pv_core.c) */
char pv_callbacks_path[1024]; /* the callback library loaded (pv_load.c), for the stats */
