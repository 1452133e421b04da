"""pyvgpu's own binary layouts, shared by the shim (C), the callbacks (numba) and Python readers.

Each is declared once here as a :class:`~pyvgpu.contract.structs.Struct`. From it come
the C structs in ``shim/generated/pv_layout.h`` (with offset checks), the
typed accessors the callbacks use (``pyvgpu/jit/runtime/fields.py``) and ctypes
classes for Python readers. Nobody writes an offset by hand.
"""

from __future__ import annotations

from pyvgpu.contract.structs import Field, Record, Struct

# N_ENTRIES, N_HELPERS (the hook table's entries and helpers), CTX and CBLIB are sized by the hook table, so they
# are made at their first use (module __getattr__, at the end): a plain `pyvgpu wrap` reads only the region's and
# the turn file's layouts, and importing the table is a large part of its start (pyvgpu/fastwrap.py).
MAX_DEVICES = 16
MAX_POOLS = 64  # memory pools a process tracks (cuMemAllocAsync accounting)
COST_SLOTS = 4096  # kernels (function + launch shape) whose GPU time a process tracks
SAMPLES = 8  # launches being timed at once
FUNC_SLOTS = 1024  # functions a process remembers as launched (their modules loaded: a new shape is gated)
TURN_STREAMS = 32  # streams a process drains before it hands a turn over (pyvgpu/jit/compute/drain.py)

# GPU_CORE_UTILIZATION_POLICY (HAMi's variable), as ctx.sm_policy and slot.sm_policy encode it.
SM_POLICIES = ("default", "force", "disable")
SM_POLICY_DEFAULT, SM_POLICY_FORCE, SM_POLICY_DISABLE = range(3)
# The compute controller's state per group device (device.sm_state).
SM_STATE_IDLE, SM_STATE_CALIBRATING, SM_STATE_HOLDING, SM_STATE_NO_MEASUREMENT, SM_STATE_BORROWING = range(5)

# Kinds of device memory a process is charged for, per device.
KIND_DATA, KIND_CONTEXT, KIND_MODULE = 0, 1, 2
KINDS = ("data", "context", "module")
N_KINDS = len(KINDS)

CTX_MAGIC = int.from_bytes(b"PVCTX017", "little")  # 15: gate pauses; 16: acct, samp_how; 17: launch_dev
UUID_BYTES = 16
MESSAGE_BYTES = 256

# The per-process context: what the shim hands every callback as its first argument. Per-process values
# live here, never as compile-time constants, so one compiled callback object serves every process.
def _ctx(n_entries: int, n_helpers: int) -> Struct:
    return Struct(
        "pv_ctx",
        [
            Field("magic", "u64", doc="CTX_MAGIC"),
            Field("n_entries", "u32", doc="hook entries in this shim"),
            Record("entry", n_entries, (
                Field("real", "u64", doc="the real driver function, 0 if the driver lacks it"),
                Field("calls", "u64", doc="calls, counted by the callbacks while count_calls is set"),
            ), doc="per hook entry: a call reads the one and counts in the other, in one cache line"),
            Field("helper", "u64", n_helpers, doc="real driver functions the policies call (hooks.HELPERS)"),
            # What every launch reads first, in one cache line (the no-share path reads no other line of the
            # context); then what a launch under a share reads besides, per device in one line (Record "dev").
            Field("region", "u64", align=64, doc="address of the mapped region, 0 without one"),
            Field("slot", "u64", doc="address of this process's slot in the region"),
            Field("sched", "u64",
                  doc="address of the mapped turn file (pyvgpu/group/turnfile.py), 0 = groups do not take turns"),
            Field("turn_out", "u64", doc="a bit per CUDA device: launches went there outside the turns since the "
                                         "last launch under turns (all bits: a launch that did not look at them)"),
            Field("turn_tick", "u64", doc="CLOCK_MONOTONIC of the watcher's last tick (a clock launches without a "
                                          "share read instead of their own)"),
            Field("sm_default_cost", "u64", doc="ns: mean of all timed launches, for kernels not timed yet"),
            Field("sm_policy", "u32", doc="GPU_CORE_UTILIZATION_POLICY: 0 default, 1 force, 2 disable"),
            Field("turn_id", "u32", doc="this process's id in turn words, 0 = not drawn yet"),
            Field("launch_dev", "u32", doc="its contexts' one device + 1; 0 none yet; ~0 several (launches ask)"),
            Field("count_calls", "u32", doc="1: the callbacks count their calls (entry.calls), for PYVGPU_STATS only: "
                                            "an atomic add per call nobody reads otherwise"),
            Field("sm_batch_ns", "u64", doc="PYVGPU_SM_BATCH_MS in ns: how far the group may run ahead of its share"),
            Field("sm_pending", "u32", doc="timing samples in flight (read every HARVEST_EVERY launches)"),
            Field("sm_launches", "u64", doc="launches seen under a compute limit without a slot (drives sampling)"),
            Field("samp_next_ns", "u64", doc="CLOCK_MONOTONIC before which no launch is timed unless its "
                                                "kernel is new"),
            # The launch's clock (pyvgpu/jit/runtime/clock.py): CLOCK_MONOTONIC extrapolated from the TSC, in one line.
            Field("clk_seq", "u64", align=64, doc="the clock's anchor: even when stable, odd while a thread "
                                                     "rewrites it"),
            Field("clk_tsc", "u64", doc="TSC at the anchor"),
            Field("clk_ns", "u64", doc="CLOCK_MONOTONIC at the anchor"),
            Field("clk_mult", "u64", doc="ns per TSC tick in units of 2^-32; 0 = no rate yet (the system "
                                            "clock is read)"),
            Field("clk_span", "u64", doc="TSC ticks an anchor is used for (about CLOCK_ANCHOR_NS), 0 = no rate yet"),
            Field("clk_base_tsc", "u64", doc="TSC at the start of the rate's measurement"),
            Field("clk_base_ns", "u64", doc="CLOCK_MONOTONIC at the start of the rate's measurement"),
            Field("clk_mode", "u32", doc="PYVGPU_CLOCK: 0 = the system clock at every launch, 1 = the TSC, anchored"),
            Field("clk_resets", "u32", doc="times an anchor disagreed with the system clock and the rate was measured "
                                           "again"),
            Record("dev", MAX_DEVICES, (
                Field("turn_entry", "u64", doc="turn entry of the CUDA device: its address, 1 = none, 0 = not looked "
                                               "up yet"),
                Field("turn_since", "u64", doc="CLOCK_MONOTONIC when this process last took the turn"),
                Field("turn_qend", "u64", doc="when the work this process queued is estimated to end"),
                Field("turn_held", "u64", doc="CLOCK_MONOTONIC up to which its turn was counted in sm_turn_ns"),
                Field("sm_nvml", "u64", doc="NVML handle of the CUDA device, 0 = not resolved yet"),
                Field("turn_mine", "u32", doc="1 from when this process takes the device's turn until it frees it: "
                                              "another holder then means its lease lapsed"),
                Field("sm_recip", "u64", doc="the share it last charged at << 33 | 2^32 // share + 1: the charge's "
                                             "division as a multiply (pyvgpu/jit/compute/limiter.py); 0 = none yet"),
                Field("turn_waited", "u64", doc="its waits for the turn, counted over time (turn.py wait_debt): "
                                                "the debt in ns >> 10 << 32 | when its last wait ended "
                                                "(CLOCK_MONOTONIC >> 10)"),
            ), size=64, doc="per CUDA device, what a launch under a share reads: one cache line each"),
            Field("gang_stopped", "u64", doc="gang_epoch + 1 of the gang's turn in which this process stopped "
                                             "for a hand-over, 0: none (pyvgpu/jit/compute/gangstop.py)"),
            Field("slot_index", "i32"),
            Field("region_fd", "i32", doc="fd holding this process's slot lock"),
            Field("n_slots", "u32"),
            Field("lock", "u32", doc="spinlock serialising pool accounting in this process"),
            Field("table", "u64", doc="address of the pointer table (allocation records)"),
            Field("table_mask", "u64", doc="entries - 1 (a power of two)"),
            Field("table_maxdisp", "u64", doc="longest probe an insert has needed"),
            Field("table_live", "u64", doc="records in the table"),
            Field("table_full", "u64", doc="allocations refused because the table was full"),
            Field("pool_handle", "u64", MAX_POOLS, doc="memory pools seen (CUmemoryPool)"),
            Field("pool_reserved", "u64", MAX_POOLS, doc="their reserved bytes as last charged"),
            Field("pool_dev", "i32", MAX_POOLS),
            Field("ctx_charged", "u64", MAX_DEVICES, doc="context bytes charged per device (1: measured, none)"),
            Field("nvml_state", "u32", doc="0 untried, 1 initialised by us, 2 unavailable"),
            # compute share (pyvgpu/jit/compute/launch.py, limiter.py, cost.py, controller.py)
            Field("sm_tick_ns", "u64", doc="CLOCK_MONOTONIC of the last reclaim by the watcher"),
            Record("cost", COST_SLOTS, (
                Field("cost_key", "u64", doc="kernel key (function and shape, or graph), 0 = free"),
                Field("cost_ns", "u64", doc="its estimated GPU time in ns"),
            ), doc="the cost table (pyvgpu/jit/compute/cost.py): a kernel's key and estimate share a line"),
            Field("samp_state", "u32", SAMPLES, doc="0 free, 1 recording, 2 in flight"),
            Field("samp_key", "u64", SAMPLES),
            # the sample's function ^ CUcontext, the device it counts on (sm_timed_ns) and how it was taken
            Field("samp_fn", "u64", SAMPLES), Field("samp_dev", "u32", SAMPLES), Field("samp_how", "u32", SAMPLES),
            Field("samp_ctx", "u64", SAMPLES, doc="CUcontext the sample's events belong to"),
            Field("samp_start", "u64", SAMPLES, doc="CUevent before the launch"),
            Field("samp_end", "u64", SAMPLES, doc="CUevent after the launch"),
            Field("samp_gate", "u32", SAMPLES, doc="the value the sample's gate word was last opened to"),
            Field("samp_gate_ns", "u64", SAMPLES, doc="CLOCK_MONOTONIC its gate closed, 0 = open (the watcher "
                                                      "opens a gate its launch left closed too long)"),
            Field("gate_forced", "u64", doc="gates the watcher opened (their launch waited inside the driver)"),
            Field("gate_off_until", "u64", doc="CLOCK_MONOTONIC until which launches are timed ungated, after "
                                               "TIMING_GATE_FORCED_MAX forced gates (0 = gated)"),
            Field("gate_offs", "u64", doc="times the gate was turned off so: each doubles the next pause"),
            Field("func_seen", "u64", FUNC_SLOTS, doc="functions launched here (handle ^ CUcontext, 0 = free): "
                                                      "their modules are loaded, so a new shape's launch is gated"),
            Field("cost_full", "u64", doc="launches whose kernel found its cost table probe run full (1 in "
                                          "COST_EVICT_EVERY takes a slot there)"),
            Field("gate_page", "u64", doc="the page the shim mapped for the gate words (never unmapped), 0 = none"),
            Field("gate_ctx", "u64", doc="the CUcontext that registered it: only its streams are gated"),
            Field("gate_host", "u64", doc="gate_page once registered with CUDA (pinned, mapped), "
                                          "0 = not yet, 1 = being registered or unavailable"),
            Field("gate_dptr", "u64", doc="their device address"),
            # the device turn (pyvgpu/jit/compute/turn.py, drain.py)
            Record("stream", TURN_STREAMS, (
                Field("turn_stream", "u64", doc="a stream this process launched on under turns, handle + 1 (0 = free)"),
                Field("turn_stream_dev", "u64", doc="the CUDA device it launched on"),
                Field("turn_stream_ctx", "u64", doc="its CUcontext"),
                Field("turn_stream_ev", "u64", doc="the CUevent a drain records on it (0 = none yet)"),
            ), doc="the streams a drain waits for; a launch compares its stream with the first ones"),
            Field("drain_ev", "u64", doc="CUevent for a stream the table had no room for, before a hand-over"),
            Field("drain_ctx", "u64", doc="CUcontext drain_ev belongs to"),
            Field("turn_stream_lock", "u32", doc="spinlock between a drain and cuStreamDestroy"),
            Field("turn_streams_lost", "u64", doc="launches on streams the table had no room for (not drained)"),
            # every group's charge on a GPU, with turns or without (pyvgpu/jit/compute/controller.py device_charged)
            Field("acct", "u64", doc="the turn file mapped for the charges' accounting (sched, or turns off), 0 none"),
            Field("acct_entry", "u64", MAX_DEVICES, doc="the device's entry in acct, 1 = none, 0 = not looked up"),
            # devices (pyvgpu/jit/devices/visible.py)
            Field("devices_refused", "u32", doc="1: CUDA sees other devices than the group's, GPU use is refused"),
            Field("devices_msg", "u8", MESSAGE_BYTES, doc="NUL-terminated: what stderr gets if CUDA sees other "
                                                           "devices than the group's"),
        ],
        doc="per-process context passed to every callback (pyvgpu/contract/layout.py)",
    )

REGION_MAGIC = int.from_bytes(b"PVGPUREG", "little")
MODE_HAMI_CORE, MODE_MPS = 0, 1  # REGION_HEADER.mode (pyvgpu/group/mps.py MODES)
REGION_VERSION = 16  # 8: REGION_HEADER.visible may carry VISIBLE_MIG; 9: what a launch reads shares lines;
#                     10: a slot's launches leave out those its sm_launches count; 11: gangs (sm_gang, sm_devs);
#                     12: a gang's common release (gang_release); 13: a gang's stops (gang_epoch ... gang_wake);
#                     14: charges beside others judged over a window too (sm_win_*); 15: timings counted by
#                     how they were taken (sm_timed); 16: what they read, launches at the mean (sm_unknown)
# How a launch's timing was taken (cost.py sample_begin): behind the timing gate, or why not. An ungated timing
# holds the launch path when its stream was idle: charges above the GPU's busy time (`pyvgpu status`, `bench sm`).
TIMED_HOW = ("gated", "first_in_context", "no_cost_slot", "gate_off", "watcher_late", "no_gate", "wait_refused")
(TIMED_GATED, TIMED_FIRST, TIMED_NO_COST_SLOT, TIMED_GATE_OFF, TIMED_WATCHER_LATE, TIMED_NO_GATE,
 TIMED_WAIT_REFUSED) = range(7)
VISIBLE_MIG = 1 << 31  # REGION_HEADER.visible[g]: group device g is a MIG instance of that GPU
VISIBLE_INDEX = VISIBLE_MIG - 1  # the NVML index in REGION_HEADER.visible[g]
GROUP_NAME_BYTES = 64

# The shared region: one file per group of processes that share a quota.
# Header, then MAX_DEVICES device records, then n_slots process slots.
REGION_HEADER = Struct(
    "pv_region_header",
    [
        Field("magic", "u64", doc="REGION_MAGIC"),
        Field("version", "u32", doc="REGION_VERSION"),
        Field("n_devices", "u32", doc="MAX_DEVICES"),
        Field("size", "u64", doc="file size in bytes"),
        Field("n_slots", "u32"),
        Field("owner_uid", "u32", doc="uid of the creator; the file must still belong to it"),
        Field("n_physical", "u32", doc="devices the machine had at creation, 0 if unknown"),
        Field("created_ns", "u64", doc="CLOCK_REALTIME at creation"),
        Field("devices_off", "u64"),
        Field("slots_off", "u64"),
        Field("device_size", "u32"),
        Field("slot_size", "u32"),
        Field("name", "u8", GROUP_NAME_BYTES, doc="group name, NUL-padded"),
        Field("sm_switch", "u32", doc="compute limits on (1) or off (0) under GPU_CORE_UTILIZATION_POLICY=default"),
        Field("sm_any", "u32", doc="devices with a compute limit; 0 lets launches skip the limiter"),
        # read by every launch under a share, beside sm_any: one line
        Field("priority", "u32", doc="the group's priority, HAMi's CUDA_TASK_PRIORITY: 0 high, 1 low (default)"),
        Field("sm_borrow", "u32", doc="1: the group may use idle GPU time beyond its share (work-conserving)"),
        Field("sm_gang", "u32", doc="0, or the group launches under a share on several devices: (its lowest "
                                    "device + 1) | (their count << 8); they share that device's budget and turn "
                                    "(pyvgpu/jit/compute/gang.py)"),
        Field("n_visible", "u32", doc="devices of the group (--devices); 0 = as the program's CUDA sees them"),
        Field("visible", "u32", MAX_DEVICES, doc="NVML (physical) index of each group device (its GPU's for a MIG "
              "instance, with VISIBLE_MIG set)"),
        Field("visible_uuid", "u8", MAX_DEVICES * UUID_BYTES, doc="its UUID (a MIG instance's own), 16 raw bytes"),
        Field("ev_next", "u64", doc="events written so far; the next goes to ring entry ev_next % N_EVENTS"),
        Field("mode", "u32",
              doc="device mode of the group: 0 hami-core (pyvgpu's limiter), 1 mps (pyvgpu/group/mps.py)"),
        Field("mps_active_threads", "u32", doc="mode mps: the clients' CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 0 = none"),
        Field("sm_devs", "u64", doc="devices the group's live processes launched on under a share (a bit each; "
                                    "the watcher's, pyvgpu/jit/compute/gang.py)"),
        Field("turn_gid", "u32", doc="the turn id the group's processes share while it is a gang (0: none yet)"),
        Field("gang_release", "u64", doc="a gang's common release: CLOCK_MONOTONIC ns up to which every rank holds "
                                         "its launches, the latest any of them had to wait for "
                                         "(pyvgpu/jit/compute/gang.py)"),
        # a gang's hand-overs (pyvgpu/jit/compute/gangstop.py)
        Field("gang_epoch", "u32", doc="bumped each time a rank of the gang takes the turn afresh"),
        Field("gang_stop", "u64", doc="gang_epoch << 32 | 1 << 31 | ranks stopped: the gang hands that turn over, "
                                      "every rank stops at its next launch (another epoch, or the bit clear: none)"),
        Field("gang_draining", "u64", doc="gang_epoch << 32 | ranks of the gang draining for that turn's stop"),
        Field("gang_stuck_ns", "u64", doc="CLOCK_MONOTONIC when a rank last found its drain waiting for a peer's "
                                          "kernel: its peers launch until it ends (0: none)"),
        Field("gang_wake", "u32", doc="bumped when gang_stuck_ns changes; held ranks sleep on it (futex)"),
        Field("gang_caught", "u32", doc="bumped when a rank's catch-up launch ended (its asker withdraws)"),
    ],
    align=64,
    doc="region header",
)
REGION_DEVICE = Struct(
    "pv_region_device",
    [
        Field("limit", "u64", doc="memory limit in bytes, 0 = none"),
        Field("used", "u64", doc="bytes reserved by the group (the reservation counter)"),
        Field("peak", "u64", doc="highest used seen"),
        Field("oom_refusals", "u64", doc="allocations refused for the limit"),
        Field("reclaimed", "u64", doc="bytes returned from dead processes"),
        Field("sm_limit", "u32", doc="compute share in percent, 0 = none"),
        Field("sm_util", "u32", doc="last measured device utilization, hundredths of a percent"),
        Field("sm_tat", "u64", doc="limiter: CLOCK_MONOTONIC ns at which the group's budget is next free"),
        Field("sm_scale", "u64", doc="controller: cost multiplier, 1/65536 units (0 = 1.0)"),
        Field("sm_ctl_ns", "u64", doc="controller: CLOCK_MONOTONIC of its last step (also its lease)"),
        Field("sm_throttle_ns", "u64", doc="ns launches waited for the budget"),
        Field("sm_steps", "u64", doc="controller steps taken"),
        Field("sm_state", "u32", doc="controller: 0 idle, 1 calibrating (alone), 2 holding (others on the GPU), "
                                     "3 no measurement, 4 holding (it borrowed beyond its share)"),
        Field("sm_group_util", "u32", doc="the group's own utilization estimate, hundredths of a percent"),
        Field("sm_cost_mark", "u64", doc="controller: the group's charged GPU time (ns, scaled) at its last step"),
        Field("sm_turn_ns", "u64", doc="ns the group's processes held the device's turn"),
        Field("sm_turn_wait_ns", "u64", doc="ns their launches waited for the turn"),
        Field("sm_borrow_ns", "u64", doc="GPU time (ns, estimated) launched beyond the share, borrowed"),
        Field("sm_borrow_mark", "u64", doc="controller: sm_borrow_ns at its last step"),
        Field("limit_created", "u64", doc="the memory limit the group was created with (`limits set` leaves it): "
                                          "a process whose variables still name it follows the group's limit"),
        Field("sm_limit_created", "u32", doc="the compute share the group was created with, likewise"),
        Field("sm_dev_mark", "u64", doc="controller: the GPU's turn entry charged_ns at its last step"),
        Field("sm_win_mark", "u64", doc="controller: the GPU's turn entry charged_ns at its window's start"),
        Field("sm_win_ns", "u64", doc="controller: CLOCK_MONOTONIC of its window's start"),
        Field("sm_timed", "u64", len(TIMED_HOW), doc="launches its processes timed on the device, by how "
                                                     "(TIMED_HOW: gated, or why not)"),
        # what the cost model measured and charged (`bench sm`'s "cost"): timings that read long, or estimates
        Field("sm_timed_ns", "u64", len(TIMED_HOW), doc="the timings harvested, summed (ns, unscaled), by how"),
        Field("sm_harvested", "u64", len(TIMED_HOW), doc="the timings sm_timed_ns sums, by how"),
        Field("sm_unknown", "u64", doc="launches charged the process's mean timing (no estimate of their own)"),
        Field("sm_unknown_ns", "u64", doc="what those were charged (ns, unscaled)"),
    ],
    align=64,
    doc="per-device state of a group",
)
REGION_SLOT = Struct(
    "pv_region_slot",
    [
        Field("state", "u32", doc="SLOT_FREE or SLOT_LIVE"),
        Field("pid", "u32", doc="pid of the owner, as it sees itself"),
        Field("sm_policy", "u32", doc="its GPU_CORE_UTILIZATION_POLICY: 0 default, 1 force, 2 disable"),
        Field("start_ns", "u64", doc="CLOCK_REALTIME when claimed"),
        Field("used", "u64", MAX_DEVICES * N_KINDS, doc="bytes by [device][kind]"),
        Field("oom_refusals", "u64"),
        # counted at every launch: the count and the first devices' charges in one cache line
        Field("launches", "u64", align=64, doc="kernel and graph launches not counted in a device's sm_launches "
                                               "(every launch: this plus those; one atomic add per launch)"),
        Record("dev", MAX_DEVICES, (
            Field("sm_launches", "u64", doc="launches charged to the group's accounting on the device (under a "
                                            "share, or taking turns beside one)"),
            Field("sm_cost_ns", "u64", doc="their estimated GPU time (ns, before scaling)"),
        ), doc="per device"),
    ],
    align=64,
    doc="one process of the group",
)
# The event log: a ring of the group's latest events (OOM refusals, reclaims,
# limit changes), written lock-free by whoever takes the next index.
REGION_EVENT = Struct(
    "pv_region_event",
    [
        Field("seq", "u64", doc="its index + 1 once written completely; readers skip entries that do not match"),
        Field("time_ns", "u64", doc="CLOCK_REALTIME"),
        Field("kind", "u32", doc="EVENT_KINDS index"),
        Field("device", "i32", doc="group device index, -1 for none"),
        Field("pid", "u32", doc="the process it concerns"),
        Field("a", "u64", doc="kind-specific: bytes asked, bytes reclaimed, old limit"),
        Field("b", "u64", doc="kind-specific: bytes used, new limit"),
    ],
    align=8,
    doc="one entry of the event ring",
)
N_EVENTS = 256
EV_OOM, EV_RECLAIM, EV_MEMORY_LIMIT, EV_SM_LIMIT, EV_DEVICES_REFUSED = 1, 2, 3, 4, 5
EV_TURN_TIMEOUT, EV_TURNS_FULL = 6, 7  # pyvgpu/jit/compute/turn.py: a wait for the turn ran out; no free entry
EV_PRIORITY, EV_SM_BORROW = 8, 9  # `pyvgpu limits set --priority / --sm-borrow`
EV_BUDGET_RESET = 10  # pyvgpu/jit/compute/limiter.py: a budget further ahead than any launch waits
EV_TIMING_GATE = 11  # pyvgpu/jit/compute/cost.py: the watcher opened a timed launch's gate
TIMING_GATE_FORCED_MAX = 8  # gates the watcher had to open before a process pauses its gate (cost.py)
BUDGET_MAX_AHEAD_NS = 600_000_000_000  # the furthest ahead of now a group's compute budget is obeyed
EVENT_KINDS = ("none", "oom", "reclaim", "memory_limit", "sm_limit", "devices_refused", "turn_timeout",
               "turns_full", "priority", "sm_borrow", "budget_reset", "timing_gate")

# Group priorities (REGION_HEADER.priority), HAMi's numbers: CUDA_TASK_PRIORITY / nvidia.com/priority.
PRIORITY_HIGH, PRIORITY_LOW = 0, 1

SLOT_FREE, SLOT_LIVE = 0, 1

# The turn file: one per machine, shared by every group. Each GPU (by UUID) has
# an entry whose turn word says which process may launch on it now, so that
# the GPU never holds two groups' deep queues at once (pyvgpu/jit/compute/turn.py).
SCHED_MAGIC = int.from_bytes(b"PVTURN01", "little")
SCHED_VERSION = 7  # 4: the holder's fields in two cache lines; 5: charged_ns, no sleepers count; 6: gang stops;
# 7: high (a high-priority group launches within its share here)
SCHED_ENTRIES = 64  # GPUs (MIG instances count as GPUs: they have UUIDs of their own)
# Ranks of a launch in the turns, most urgent first (pyvgpu/jit/compute/turn.py): within its share ("due") before
# best effort (no share, or borrowing beyond it); high priority before low within each. Even ranks are high.
RANK_HIGH_DUE, RANK_DUE, RANK_HIGH_BEST_EFFORT, RANK_BEST_EFFORT = range(4)
N_RANKS = 4
SCHED_HEADER = Struct(
    "pv_sched_header",
    [
        Field("magic", "u64", doc="SCHED_MAGIC"),
        Field("version", "u32", doc="SCHED_VERSION"),
        Field("n_entries", "u32", doc="SCHED_ENTRIES"),
        Field("size", "u64", doc="file size in bytes"),
        Field("next_id", "u32", doc="the last process id handed out (ids are 1..2^32-1, then wrap)"),
        Field("active", "u64", doc="CLOCK_MONOTONIC ns until which a group with a share takes turns on some GPU "
                                   "here: until then launches without a share look at the turns"),
    ],
    align=64,
    doc="turn file header",
)
SCHED_ENTRY = Struct(
    "pv_sched_entry",
    [
        # what the holder reads and writes at each launch, in two cache lines
        Field("turn", "u64", doc="holder id << 32 | lease end (CLOCK_MONOTONIC >> 10; 0 = free, the id is then "
                                 "the last holder's)"),
        Field("qend", "u64", doc="CLOCK_MONOTONIC ns when the work queued on this GPU under turns, every "
                                 "process's together, is estimated to end (0: none yet)"),
        Field("active", "u64", doc="CLOCK_MONOTONIC ns until which a group with a share takes turns on this GPU"),
        Field("high", "u64", doc="CLOCK_MONOTONIC ns until which a high-priority group launches within its share "
                                 "on this GPU: until then a low-priority holder keeps its queue short"),
        Field("want", "u64", N_RANKS, doc="per rank, the latest waiter: id << 32 | when it last looked"),
        Field("rank", "u32", doc="the holder's rank when it took the turn"),
        Field("resv", "u64", N_RANKS, doc="per rank, the latest reservation: id << 32 | when its budget is free "
                                          "again (CLOCK_MONOTONIC >> 10); the holder hands over by then"),
        Field("key", "u64", doc="hash of the GPU's UUID | 1; 0 = free entry"),
        Field("freed_ns", "u64", doc="CLOCK_MONOTONIC when the last holder freed the turn after its drain"),
        Field("seq", "u32", doc="bumped at each free (waiters sleep on it with a futex)"),
        Field("lapses", "u32", doc="times a process found its lapsed turn taken and let its own work finish "
                                   "before launching again (pyvgpu/jit/compute/turn.py)"),
        Field("handovers", "u64", doc="times the turn passed from one process to another"),
        Field("wait_ns", "u64", doc="ns launches waited for the turn, all processes together"),
        Field("drains", "u64", doc="hand-overs that waited for the holder's work to finish"),
        Field("drain_ns", "u64", doc="ns those waits took"),
        Field("gaps", "u64", doc="turns taken after a holder freed it"),
        Field("gap_ns", "u64", doc="ns from each free (the holder's work done) to the next holder taking it"),
        Field("coruns", "u64", doc="launches made beside the holder while both queues were short"),
        Field("preempts", "u64", doc="hand-overs to a more urgent or reserved waiter before the slice ended"),
        Field("max_wait_ns", "u64", doc="the longest single wait of a launch within its share for the turn"),
        Field("lapse_ns", "u64", doc="ns those waits after a lapse took"),
        Field("joins", "u64", doc="times a process that had launched outside the turns let that work finish "
                                  "before its first launch under them"),
        Field("join_ns", "u64", doc="ns those waits took"),
        Field("charged_ns", "u64", doc="GPU time (ns, scaled) the groups with a share here were charged, added by "
                                       "each group's controller once a period (pyvgpu/jit/compute/controller.py)"),
        Field("stucks", "u64", doc="drains of a gang's rank that waited for a peer's kernel past their estimate "
                                   "(pyvgpu/jit/compute/gangstop.py)"),
        Field("stuck_ns", "u64", doc="ns those drains took"),
        Field("catchups", "u64", doc="launches a gang's rank made while a peer's drain waited for them"),
        Field("unmatched", "u64", doc="stuck drains that gave up waiting and handed the turn over (their kernel "
                                      "then waits beside the next holder)"),
    ],
    align=64,
    doc="one GPU's turn",
)
SCHED_ENTRIES_OFF = SCHED_HEADER.size
SCHED_SIZE = SCHED_ENTRIES_OFF + SCHED_ENTRIES * SCHED_ENTRY.size
REGION_DEVICES_OFF = REGION_HEADER.size
REGION_EVENTS_OFF = REGION_DEVICES_OFF + MAX_DEVICES * REGION_DEVICE.size
REGION_SLOTS_OFF = REGION_EVENTS_OFF + N_EVENTS * REGION_EVENT.size
DEFAULT_SLOTS = 1024


def region_size(n_slots: int) -> int:
    return REGION_SLOTS_OFF + n_slots * REGION_SLOT.size


# The callback library (pyvgpu/native/cblib.py): numba's compiled callbacks linked into a shared object that
# exports one symbol, CBLIB_SYMBOL, of this layout. The shim dlopens the library and takes every
# callback and service address from it, with no interpreter in the process.
CBLIB_SYMBOL = "pyvgpu_callbacks"
CBLIB_MAGIC = int.from_bytes(b"PVCBLIB1", "little")
CBLIB_FORMAT = 1
CBLIB_TEXT_BYTES = 32
def _cblib(n_entries: int, n_services: int) -> Struct:
    return Struct(
        "pv_cblib",
        [
            Field("magic", "u64", doc="CBLIB_MAGIC"),
            Field("format", "u32", doc="CBLIB_FORMAT"),
            Field("n_entries", "u32", doc="hook entries it was compiled for (N_ENTRIES)"),
            Field("n_services", "u32", doc="services (hooks.SERVICES)"),
            Field("tuned", "u32", doc="0: for any CPU of the architecture; 1: for the CPU cpu_id names only"),
            Field("cpu_id", "u64", doc="pyvgpu.host.cpuid.cpu_id() of the CPU it was tuned for; 0 when portable"),
            Field("table_hash", "u8", CBLIB_TEXT_BYTES, doc="hooks.table_hash(), NUL-terminated"),
            Field("key", "u8", CBLIB_TEXT_BYTES, doc="pyvgpu.native.cache.cache_key() of its sources, NUL-terminated"),
            Field("cpu", "u8", 64, doc="the CPU LLVM compiled for, NUL-terminated"),
            Field("entries", "u64", n_entries, doc="callback address per hook entry; 0 for entries implemented in C"),
            Field("services", "u64", n_services, doc="address per service, in hooks.SERVICES order"),
        ],
        doc="the table a callback library exports (pyvgpu/native/cblib.py)",
    )


_FROM_HOOKS = ("N_ENTRIES", "N_HELPERS", "CTX", "CBLIB")


def __getattr__(name: str) -> object:
    """The layouts sized by the hook table, made once at the first use of any of them (see the top)."""
    if name not in _FROM_HOOKS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pyvgpu.contract import hooks

    n_entries, n_helpers = len(hooks.ENTRIES), len(hooks.HELPERS)
    globals().update(N_ENTRIES=n_entries, N_HELPERS=n_helpers, CTX=_ctx(n_entries, n_helpers),
                     CBLIB=_cblib(n_entries, len(hooks.SERVICES)))
    return globals()[name]
