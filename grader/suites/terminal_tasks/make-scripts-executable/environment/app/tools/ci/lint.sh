#!/bin/bash
echo lint
