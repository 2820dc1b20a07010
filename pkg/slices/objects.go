package slices

import (
	"maps"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Objects renders a node's pools as ResourceSlice objects, named
// deterministically, the way they look once published. It serves
// `--print-resource-slices`, fake nodes and offline planning.
func Objects(node string, res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, poolName := range slices.Sorted(maps.Keys(res.Pools)) {
		pool := res.Pools[poolName]
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{
					Name: SliceName(node, i),
				},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   topology.DriverName,
					NodeName: ptr.To(node),
					Pool: resourceapi.ResourcePool{
						Name:               poolName,
						Generation:         pool.Generation,
						ResourceSliceCount: int64(len(pool.Slices)),
					},
					Devices: s.Devices,
				},
			})
		}
	}
	return out
}

// SliceName is the name of a node's i-th slice outside the kubelet plugin.
func SliceName(node string, i int) string {
	return node + "-" + topology.DriverName + "-" + strconv.Itoa(i)
}
