package nvml

import (
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
)

var _ gpu.ComputeModes = (*Backend)(nil)

var computeModes = map[gonvml.ComputeMode]gpu.ComputeMode{
	gonvml.COMPUTEMODE_DEFAULT:           gpu.ComputeModeDefault,
	gonvml.COMPUTEMODE_EXCLUSIVE_THREAD:  gpu.ComputeModeExclusiveThread,
	gonvml.COMPUTEMODE_PROHIBITED:        gpu.ComputeModeProhibited,
	gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS: gpu.ComputeModeExclusiveProcess,
}

// ComputeMode implements gpu.ComputeModes (nvmlDeviceGetComputeMode).
func (b *Backend) ComputeMode(uuid string) (gpu.ComputeMode, error) {
	dev, err := b.deviceByUUID(uuid)
	if err != nil {
		return "", err
	}
	m, ret := dev.GetComputeMode()
	if err := check(ret); err != nil {
		return "", fmt.Errorf("read compute mode of GPU %s: %w", uuid, err)
	}
	mode, ok := computeModes[m]
	if !ok {
		return "", fmt.Errorf("read compute mode of GPU %s: NVML reports unknown compute mode %d", uuid, m)
	}
	return mode, nil
}

// SetComputeMode implements gpu.ComputeModes (nvmlDeviceSetComputeMode,
// which needs root). The mode lasts until the driver unloads.
func (b *Backend) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	var m gonvml.ComputeMode = -1
	for k, v := range computeModes {
		if v == mode {
			m = k
		}
	}
	if m < 0 || mode == gpu.ComputeModeExclusiveThread {
		return fmt.Errorf("set compute mode of GPU %s: %q is not one NVML sets (%s, %s or %s)", uuid, mode, gpu.ComputeModeDefault, gpu.ComputeModeExclusiveProcess, gpu.ComputeModeProhibited)
	}
	dev, err := b.deviceByUUID(uuid)
	if err != nil {
		return err
	}
	if err := check(dev.SetComputeMode(m)); err != nil {
		if errors.Is(err, gonvml.ERROR_NO_PERMISSION) {
			return fmt.Errorf("set compute mode of GPU %s to %s: %w (NVML sets compute modes for root only)", uuid, mode, err)
		}
		return fmt.Errorf("set compute mode of GPU %s to %s: %w", uuid, mode, err)
	}
	return nil
}

func (b *Backend) deviceByUUID(uuid string) (gonvml.Device, error) {
	dev, ret := b.lib.DeviceGetHandleByUUID(uuid)
	if err := check(ret); err != nil {
		return nil, fmt.Errorf("find GPU %s in NVML: %w", uuid, err)
	}
	return dev, nil
}
