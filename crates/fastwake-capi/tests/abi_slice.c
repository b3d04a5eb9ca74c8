/* Included by abi.c: the calling thread's scheduler slice. */

static void slice_checks(void) {
    uint64_t ns = 0;
    check(fw_slice_set(50000) == EINVAL && !strchr(fw_last_error(), '\n'),
          "slice: 50 us is EINVAL with a one-line cause", "accepted");
    check(fw_slice_set(200000000) == EINVAL, "slice: 200 ms is EINVAL", "accepted");
    check(fw_slice_get(NULL) == EINVAL, "slice: get into NULL is EINVAL", "accepted");
    int rc = fw_slice_set(300000);
    if (rc == EOPNOTSUPP) {
        printf("SKIPPED slice read-back: %s\n", fw_last_error());
        return;
    }
    check(rc == 0 && fw_slice_get(&ns) == 0 && ns == 300000, "slice: 300 us set and read back",
          "wrong slice");
    check(fw_slice_set(0) == 0 && fw_slice_get(&ns) == 0 && ns != 300000,
          "slice: 0 gives the default back", "still 300 us");
}
