"""Pure launcher logic: task environments, the job's completion rules, exit reasons."""
