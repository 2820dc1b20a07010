package planner

// LeafUsage is the GPU use of one leaf. Nodes without a leaf are reported
// under an empty Leaf.
type LeafUsage struct {
	Spine, Leaf string
	Nodes       int
	GPUs        int // every gputopo GPU
	Used        int // allocated, or held by a reservation
	// Unavailable GPUs are not used but cannot be given out: tainted
	// NoSchedule/NoExecute, or on a node marked unschedulable.
	Unavailable int
	Free        int
	FreeNodes   int     // schedulable nodes whose GPUs are all free
	Utilization float64 // Used / GPUs; 0 for a leaf without GPUs
}

// Usage summarises a snapshot for metrics and `gputopo` output.
type Usage struct {
	Leaves                        []LeafUsage // in topology order
	GPUs, Used, Unavailable, Free int
	Utilization                   float64 // Used / GPUs
	// Fragmentation is the fraction of free GPUs that a whole-node pod
	// cannot use: free GPUs on nodes where at least one GPU is used or
	// unavailable, divided by all free GPUs. 0 means every free GPU sits
	// on a completely free node, 1 means no node is completely free
	// although GPUs are. It is 0 when no GPU is free.
	Fragmentation float64
	// LeafFragmentation is the same one level up: the fraction of
	// completely free nodes that sit in leaves that are not completely
	// free, which a job that needs a whole leaf cannot use. It is 0 when
	// no node is completely free.
	LeafFragmentation float64
}

// Measure computes GPU use and fragmentation. Reserved GPUs count as used,
// and so do shared GPUs with any share held.
func Measure(snap *Snapshot, res *Reservations) Usage {
	c := snap.cluster
	used := snap.usedOrShared(res)
	var u Usage
	var stranded, freeNodes, strandedNodes int
	account := func(lu *LeafUsage, nodes []int) {
		whole := len(nodes) > 0
		leafFree := 0
		for _, n := range nodes {
			nd := c.nodes[n]
			gpus := nd.gpus.count()
			usedGPUs := gpus - nd.gpus.free(used.at(n))
			free := nd.healthy.free(used.at(n))
			if !nd.schedulable {
				free = 0
			}
			lu.Nodes++
			if gpus == 0 {
				continue // a CPU node neither strands GPUs nor breaks a whole leaf
			}
			lu.GPUs += gpus
			lu.Used += usedGPUs
			lu.Free += free
			lu.Unavailable += gpus - usedGPUs - free
			if free == gpus {
				lu.FreeNodes++
				leafFree++
			} else {
				whole = false
				stranded += free
			}
		}
		freeNodes += leafFree
		if !whole || lu.Leaf == "" {
			strandedNodes += leafFree
		}
		if lu.GPUs > 0 {
			lu.Utilization = float64(lu.Used) / float64(lu.GPUs)
		}
		u.GPUs += lu.GPUs
		u.Used += lu.Used
		u.Unavailable += lu.Unavailable
		u.Free += lu.Free
		u.Leaves = append(u.Leaves, *lu)
	}
	var loose []int
	for _, s := range c.spines {
		for _, l := range s.leaves {
			account(&LeafUsage{Spine: s.name, Leaf: l.name}, l.nodes)
		}
		if s.extra > 0 {
			account(&LeafUsage{Spine: s.name}, s.nodes[len(s.nodes)-s.extra:])
		}
	}
	for i, nd := range c.nodes {
		if nd.spine == nil && !nd.gone {
			loose = append(loose, i)
		}
	}
	if len(loose) > 0 {
		account(&LeafUsage{}, loose)
	}
	if u.GPUs > 0 {
		u.Utilization = float64(u.Used) / float64(u.GPUs)
	}
	if u.Free > 0 {
		u.Fragmentation = float64(stranded) / float64(u.Free)
	}
	if freeNodes > 0 {
		u.LeafFragmentation = float64(strandedNodes) / float64(freeNodes)
	}
	return u
}
