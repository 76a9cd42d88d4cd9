package sources

import "github.com/Masterminds/semver/v3"

// HighestVersion returns the tag with the highest version within c, the
// one rule git and OCI sources share for a semver range. Tags that are not
// versions are skipped; of two tags with the same version ("v1.2.0" and
// "1.2.0") the one that sorts last wins, so the choice is stable whatever
// order the remote lists them in.
func HighestVersion(tags []string, c *semver.Constraints) (string, bool) {
	var best *semver.Version
	bestTag := ""
	for _, tag := range tags {
		v, err := semver.NewVersion(tag)
		if err != nil || !c.Check(v) {
			continue
		}
		if best == nil || v.GreaterThan(best) || (v.Equal(best) && tag > bestTag) {
			best, bestTag = v, tag
		}
	}
	return bestTag, best != nil
}
