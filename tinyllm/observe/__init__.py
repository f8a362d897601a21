"""What viewers read: snapshots, lifecycle timelines, recordings, trace export, stats."""
