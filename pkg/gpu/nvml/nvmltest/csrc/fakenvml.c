/*
 * An NVML stand-in: a shared library with the NVML C API's symbols that
 * answers for GPUs described at build time (fakenvml_gpus.h, written by
 * nvmltest.Build), so that the plugin's nvml backend runs through go-nvml's
 * real dlopen and cgo path on a machine without a GPU. Built against the
 * nvml.h that go-nvml ships, so every type and signature is NVML's own.
 *
 * What it answers: init and shutdown, the driver and CUDA versions, each
 * GPU's handle (by index, UUID and PCI bus ID), UUID, name, index, minor,
 * architecture, compute capability, memory, PCI info and MIG mode
 * (disabled); NVLink lanes to an NVSwitch; compute modes, kept per GPU;
 * event sets whose waits time out, or deliver an Xid error written to a
 * file (nvmltest.Config.EventsFile). Every other function go-nvml
 * calls is a stub, generated beside this file, that returns
 * NVML_ERROR_NOT_SUPPORTED.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvml.h"

struct fake_gpu {
	const char *uuid;
	const char *name;
	const char *bus_id;
	unsigned int minor;
	unsigned long long memory;
	nvmlDeviceArchitecture_t arch;
	int cc_major, cc_minor;
	unsigned int nvlinks;
};

/* FAKE_DRIVER_VERSION, FAKE_CUDA_VERSION, FAKE_EVENTS_FILE, FAKE_GPU_COUNT and fake_gpus[]. */
#include "fakenvml_gpus.h"

struct nvmlDevice_st {
	unsigned int index;
	nvmlComputeMode_t compute_mode;
};

struct nvmlEventSet_st {
	int unused;
};

static struct nvmlDevice_st devices[FAKE_GPU_COUNT > 0 ? FAKE_GPU_COUNT : 1];
static struct nvmlEventSet_st event_set;
static int initialised;

static const char switch_bus_id[] = "0000:c0:00.0";

static nvmlReturn_t put_string(char *buf, unsigned int length, const char *s)
{
	if (buf == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(s) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, s);
	return NVML_SUCCESS;
}

/*
 * go-nvml's nvml.h wraps each handle in a struct of one pointer, which is
 * passed as the pointer itself.
 */
static const struct fake_gpu *gpu_of(nvmlDevice_t d)
{
	if (d.handle == NULL || d.handle < devices || d.handle >= devices + FAKE_GPU_COUNT)
		return NULL;
	return &fake_gpus[d.handle->index];
}

static nvmlDevice_t handle_of(unsigned int i)
{
	nvmlDevice_t d = {&devices[i]};
	return d;
}

static void pci_of(const char *bus_id, nvmlPciInfo_t *pci)
{
	unsigned int domain = 0, bus = 0, device = 0;
	memset(pci, 0, sizeof(*pci));
	sscanf(bus_id, "%x:%x:%x", &domain, &bus, &device);
	pci->domain = domain;
	pci->bus = bus;
	pci->device = device;
	pci->pciDeviceId = 0x233010de;
	snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", domain, bus, device);
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", domain, bus, device);
}

nvmlReturn_t nvmlInit_v2(void)
{
	unsigned int i;
	if (!initialised) {
		for (i = 0; i < FAKE_GPU_COUNT; i++) {
			devices[i].index = i;
			devices[i].compute_mode = NVML_COMPUTEMODE_DEFAULT;
		}
	}
	initialised++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void)
{
	if (!initialised)
		return NVML_ERROR_UNINITIALIZED;
	initialised--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	return put_string(version, length, FAKE_DRIVER_VERSION);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	return put_string(version, length, "12." FAKE_DRIVER_VERSION);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
	if (v == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*v = FAKE_CUDA_VERSION;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = FAKE_GPU_COUNT;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (device == NULL || index >= FAKE_GPU_COUNT)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = handle_of(index);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	unsigned int i;
	if (uuid == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (i = 0; i < FAKE_GPU_COUNT; i++) {
		if (strcmp(fake_gpus[i].uuid, uuid) == 0) {
			*device = handle_of(i);
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
	unsigned int i;
	nvmlPciInfo_t want, have;
	if (bus_id == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pci_of(bus_id, &want);
	for (i = 0; i < FAKE_GPU_COUNT; i++) {
		pci_of(fake_gpus[i].bus_id, &have);
		if (want.domain == have.domain && want.bus == have.bus && want.device == have.device) {
			*device = handle_of(i);
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

#define GPU_OR_FAIL(g, d) \
	const struct fake_gpu *g = gpu_of(d); \
	if (g == NULL) \
		return NVML_ERROR_INVALID_ARGUMENT

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
	GPU_OR_FAIL(g, d);
	return put_string(uuid, length, g->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
	GPU_OR_FAIL(g, d);
	return put_string(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (index == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = d.handle->index;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
	GPU_OR_FAIL(g, d);
	if (minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*minor = g->minor;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, nvmlDeviceArchitecture_t *arch)
{
	GPU_OR_FAIL(g, d);
	if (arch == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*arch = g->arch;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
	GPU_OR_FAIL(g, d);
	if (major == NULL || minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = g->cc_major;
	*minor = g->cc_minor;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem)
{
	GPU_OR_FAIL(g, d);
	if (mem == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	mem->total = g->memory;
	mem->used = 0;
	mem->free = g->memory;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem)
{
	GPU_OR_FAIL(g, d);
	if (mem == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	mem->total = g->memory;
	mem->reserved = 0;
	mem->used = 0;
	mem->free = g->memory;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
	GPU_OR_FAIL(g, d);
	if (pci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pci_of(g->bus_id, pci);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (current == NULL || pending == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*current = NVML_DEVICE_MIG_DISABLE;
	*pending = NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (is_mig == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*is_mig = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active)
{
	GPU_OR_FAIL(g, d);
	if (active == NULL || link >= NVML_NVLINK_MAX_LINKS)
		return NVML_ERROR_INVALID_ARGUMENT;
	*active = link < g->nvlinks ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
	GPU_OR_FAIL(g, d);
	if (pci == NULL || link >= g->nvlinks)
		return NVML_ERROR_INVALID_ARGUMENT;
	pci_of(switch_bus_id, pci);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, nvmlIntNvLinkDeviceType_t *type)
{
	GPU_OR_FAIL(g, d);
	if (type == NULL || link >= g->nvlinks)
		return NVML_ERROR_INVALID_ARGUMENT;
	*type = NVML_NVLINK_DEVICE_TYPE_SWITCH;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (mode == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*mode = d.handle->compute_mode;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, nvmlComputeMode_t mode)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (mode < NVML_COMPUTEMODE_DEFAULT || mode >= NVML_COMPUTEMODE_COUNT)
		return NVML_ERROR_INVALID_ARGUMENT;
	d.handle->compute_mode = mode;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	if (set == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	set->handle = &event_set;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	(void)set;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	if (types == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*types = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
	GPU_OR_FAIL(g, d);
	(void)g;
	(void)types;
	return set.handle == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

/*
 * A wait ends in its timeout unless FAKE_EVENTS_FILE names a file that
 * appears meanwhile (looked for every 50 ms): its first line, "<index>
 * <xid>", is delivered as an Xid critical error of that GPU (an Xid of 0 as
 * a double-bit ECC error) and the file removed.
 */
static int take_event(nvmlEventData_t *data)
{
	unsigned int index = 0;
	unsigned long long xid = 0;
	int n;
	FILE *f;

	if (FAKE_EVENTS_FILE[0] == 0 || (f = fopen(FAKE_EVENTS_FILE, "r")) == NULL)
		return 0;
	n = fscanf(f, "%u %llu", &index, &xid);
	fclose(f);
	unlink(FAKE_EVENTS_FILE);
	if (n != 2 || index >= FAKE_GPU_COUNT || data == NULL)
		return 0;
	memset(data, 0, sizeof(*data));
	data->device = handle_of(index);
	data->eventType = xid ? nvmlEventTypeXidCriticalError : nvmlEventTypeDoubleBitEccError;
	data->eventData = xid;
	data->gpuInstanceId = 0xFFFFFFFF;
	data->computeInstanceId = 0xFFFFFFFF;
	return 1;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	struct timespec tick = {0, 50 * 1000000L};
	unsigned int waited = 0;
	(void)set;
	for (;;) {
		if (take_event(data))
			return NVML_SUCCESS;
		if (waited >= timeoutms)
			return NVML_ERROR_TIMEOUT;
		nanosleep(&tick, NULL);
		waited += 50;
	}
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	return nvmlEventSetWait_v2(set, data, timeoutms);
}
