package topology

// Names for shared GPUs. A GPU the plugin publishes for sharing is one
// device with allowMultipleAllocations: claims draw consumable capacity
// from it (DRA consumable capacity, KEP-5075) instead of taking it whole.
const (
	// CapacityMilliGPU is a shared GPU's compute, in thousandths of the
	// GPU: 1000 in all. A claim that does not ask for it takes all 1000.
	CapacityMilliGPU = "milliGPU"
	// MilliPerGPU is a whole GPU in CapacityMilliGPU units.
	MilliPerGPU = 1000
	// ShareMinMilliGPU and ShareStepMilliGPU keep compute shares sensible:
	// at least 1 % of the GPU, in steps of 1 % (MPS limits whole percents).
	ShareMinMilliGPU  = 10
	ShareStepMilliGPU = 10
	// ShareMemoryStep is the granularity of memory shares. A claim that
	// does not ask for memory reserves none (see README, shared GPUs).
	ShareMemoryStep = 256 << 20

	// LabelSharedGPUs on a node overrides the plugin's --shared-gpus for
	// that node: "all", "none" or GPU indexes such as "0,1,4".
	LabelSharedGPUs = "gputopo.dev/shared-gpus"
)

// Environment variables a container with a share of a GPU gets. For a
// claim with shares of several GPUs the values are comma-separated, in the
// order of NVIDIA_VISIBLE_DEVICES.
const (
	// EnvShareMilliGPU is the claim's compute share in thousandths.
	EnvShareMilliGPU = "GPUTOPO_SHARE_MILLIGPU"
	// EnvShareMemory is the memory the share may pin, in bytes: what the
	// claim asked for, or its compute share of the GPU's memory.
	EnvShareMemory = "GPUTOPO_SHARE_MEMORY_BYTES"
	// EnvMPSActiveThreadPercentage and EnvMPSPinnedMemoryLimit are CUDA
	// MPS client limits, set on real GPUs, whose shared GPUs the plugin
	// serves with an MPS control daemon each (pkg/mps).
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemoryLimit      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSPipeDirectory is where the MPS control daemon of a shared GPU
	// keeps its pipes: set for the daemon to its directory on the host,
	// and for a share's containers to MPSContainerPipeDir, where that
	// directory is mounted. EnvMPSLogDirectory is the daemon's log
	// directory, and EnvCUDAVisibleDevices names the daemon's one GPU.
	EnvMPSPipeDirectory   = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSLogDirectory    = "CUDA_MPS_LOG_DIRECTORY"
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
	// MPSContainerPipeDir is MPS's default pipe directory, so a client
	// finds its GPU's daemon even without EnvMPSPipeDirectory.
	MPSContainerPipeDir = "/tmp/nvidia-mps"
	// MPSContainerShmDir is where a share's containers get the directory
	// their GPU's MPS daemon sees as /dev/shm.
	MPSContainerShmDir = "/dev/shm"
)
