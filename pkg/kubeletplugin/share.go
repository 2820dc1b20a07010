package kubeletplugin

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// preparedDevice is what the checkpoint records of one allocated device:
// for a share, its share ID and the capacity it consumes.
func preparedDevice(r resourceapi.DeviceRequestAllocationResult, g gpu.Device, admin bool) checkpoint.PreparedDevice {
	d := checkpoint.PreparedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device, UUID: g.UUID, AdminAccess: admin}
	if r.ShareID != nil {
		d.ShareID = string(*r.ShareID)
		d.Consumed = map[string]string{}
		for name, q := range r.ConsumedCapacity {
			d.Consumed[string(name)] = q.String()
		}
	}
	return d
}

// checkHolders refuses a device another claim holds, unless every holder,
// the new one included, holds a share and the shares fit the GPU
// together. The scheduler never allocates more; this catches a plan or an
// allocation written by hand that would. Admin access holds nothing.
func (s *state) checkHolders(uid string, d checkpoint.PreparedDevice, g gpu.Device) error {
	holders := s.cp.Holders(d.Pool, d.Device, uid)
	if len(holders) == 0 || d.AdminAccess {
		return nil
	}
	if d.ShareID == "" || holders[0].Device.ShareID == "" {
		h := holders[0]
		if h.Device.ShareID != "" {
			return fmt.Errorf("%w: %s is shared, by claim %s among others; a claim for the whole GPU waits until every share is unprepared", ErrDeviceInUse, d.Device, s.describe(h.ClaimUID))
		}
		return fmt.Errorf("%w: %s is held by claim %s; unprepare that claim first", ErrDeviceInUse, d.Device, s.describe(h.ClaimUID))
	}
	limits := map[string]int64{topology.CapacityMilliGPU: topology.MilliPerGPU, topology.CapacityMemory: g.MemoryBytes}
	for name, limit := range limits {
		sum, err := consumed(d, name)
		if err != nil {
			return err
		}
		for _, h := range holders {
			v, err := consumed(h.Device, name)
			if err != nil {
				return err
			}
			sum += v
		}
		if sum > limit {
			return fmt.Errorf("%w: the shares of %s would take %d %s, more than its %d; the other shares are held by %s", ErrDeviceInUse, d.Device, sum, name, limit, s.describeAll(holders))
		}
	}
	return nil
}

func (s *state) describeAll(holders []checkpoint.Holder) string {
	names := make([]string, len(holders))
	for i, h := range holders {
		names[i] = s.describe(h.ClaimUID)
	}
	return strings.Join(names, ", ")
}

// consumed is the capacity a prepared share takes, 0 when it takes none
// of it.
func consumed(d checkpoint.PreparedDevice, name string) (int64, error) {
	v, ok := d.Consumed[name]
	if !ok {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("share %s of %s: consumed %s %q: %w", d.ShareID, d.Device, name, v, err)
	}
	return q.Value(), nil
}

// shareEnv tells a container what its shares of GPUs are, in the order
// of NVIDIA_VISIBLE_DEVICES (device name order): the compute share in
// thousandths and the memory it may pin (what the claim asked for, or its
// compute share of the GPU's memory). On real GPUs the same limits go to
// CUDA MPS clients: the smallest compute share as the active-thread
// percentage and each memory limit by device ordinal. Nothing is set for
// a claim that holds its GPUs whole.
func shareEnv(devs []checkpoint.PreparedDevice, gpus map[string]gpu.Device, mps bool) (map[string]string, error) {
	devs = slices.Clone(devs)
	slices.SortFunc(devs, func(a, b checkpoint.PreparedDevice) int { return strings.Compare(a.Device, b.Device) })
	if !slices.ContainsFunc(devs, func(d checkpoint.PreparedDevice) bool { return d.ShareID != "" }) {
		return nil, nil
	}
	var millis, mems, limits []string
	percent := int64(100)
	for i, d := range devs {
		milli, mem, err := shareOf(d, gpus[d.Device])
		if err != nil {
			return nil, err
		}
		percent = min(percent, percentOf(milli))
		millis = append(millis, strconv.FormatInt(milli, 10))
		mems = append(mems, strconv.FormatInt(mem, 10))
		limits = append(limits, fmt.Sprintf("%d=%dM", i, mem>>20))
	}
	env := map[string]string{
		topology.EnvShareMilliGPU: strings.Join(millis, ","),
		topology.EnvShareMemory:   strings.Join(mems, ","),
	}
	if mps {
		env[topology.EnvMPSActiveThreadPercentage] = strconv.FormatInt(percent, 10)
		env[topology.EnvMPSPinnedMemoryLimit] = strings.Join(limits, ",")
	}
	return env, nil
}

// shareOf is the compute (thousandths) and memory (bytes) a device of a
// claim may use: the whole GPU, or a share's consumed capacity, its memory
// being what the claim asked for, or its compute share of the GPU's memory.
func shareOf(d checkpoint.PreparedDevice, g gpu.Device) (milli, mem int64, err error) {
	milli, mem = topology.MilliPerGPU, g.MemoryBytes
	if d.ShareID == "" {
		return milli, mem, nil
	}
	if _, ok := d.Consumed[topology.CapacityMilliGPU]; ok {
		if milli, err = consumed(d, topology.CapacityMilliGPU); err != nil {
			return 0, 0, err
		}
	}
	asked, err := consumed(d, topology.CapacityMemory)
	if err != nil {
		return 0, 0, err
	}
	if asked == 0 {
		return milli, g.MemoryBytes * milli / topology.MilliPerGPU, nil
	}
	return milli, asked, nil
}
