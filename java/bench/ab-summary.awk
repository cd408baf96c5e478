# The summary of run-ab.sh's results.txt (mode partitions repeat records/s
# cpu_us/record in-run_cpu_us/record per line): per mode and partition
# count, the medians over the repeats, and the median over the repeats of
# each repeat's ratio to "limit" (the runs of one repeat ran back to back).
#   awk -f ab-summary.awk results.txt | sort -k2,2nr -k1,1
  $4 != "FAILED" { k=$1" "$2; rate[k]=rate[k]" "$4; cpu[k]=cpu[k]" "$5; keys[k]=1; r[$1" "$2" "$3]=$4; c[$1" "$2" "$3]=$5; reps[$3]=1 }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t=a[i]; a[i]=a[j]; a[j]=t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    for (k in keys) { mr[k]=median(rate[k]); mc[k]=median(cpu[k]) }
    for (k in keys) {
      split(k, kk, " "); l = "limit " kk[2]; rr = ""; rc = ""
      for (rep in reps) if ((k" "rep) in r && (l" "rep) in r) { rr = rr " " r[k" "rep]/r[l" "rep]; rc = rc " " c[k" "rep]/c[l" "rep] }
      printf "%-8s %d partitions: %8.0f records/s (%.2fx limit), %6.2f µs CPU/record (%.2fx limit)\n",
        kk[1], kk[2], mr[k], rr == "" ? 0 : median(rr), mc[k], rc == "" ? 0 : median(rc)
    }
  }