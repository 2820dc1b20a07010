package topology

// NaturalLess orders names the way people number racks: digit runs compare as
// numbers, so leaf-2 comes before leaf-10. Names equal as numbers ("a01",
// "a1") fall back to byte order so sorting stays deterministic.
func NaturalLess(a, b string) bool {
	x, y := a, b
	for x != "" && y != "" {
		dx, dy := digits(x), digits(y)
		if dx > 0 && dy > 0 {
			nx, ny := trimZeros(x[:dx]), trimZeros(y[:dy])
			if len(nx) != len(ny) {
				return len(nx) < len(ny)
			}
			if nx != ny {
				return nx < ny
			}
			x, y = x[dx:], y[dy:]
			continue
		}
		if x[0] != y[0] {
			return x[0] < y[0]
		}
		x, y = x[1:], y[1:]
	}
	if len(x) != len(y) {
		return len(x) < len(y)
	}
	return a < b
}

func digits(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}
